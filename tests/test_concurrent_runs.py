"""Two runs, one folder: nothing lost. Resumed tables are validated, never trusted blindly.

- two ``eval contacts`` processes into one folder: every row survives (the second
  is refused while the first holds the folder, or resumes after it);
- several processes adding rows to one ResultsStore: every row of every writer
  survives (the old store rewrote the table from its own copy and dropped the others');
- a lock held by a killed process is stale and taken over;
- duplicated, truncated and garbage rows are dropped with a warning, never counted twice;
- a missing FP output is rebuilt; a run that scored nothing may be rerun with new settings.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time

import pytest

from ptq_protein.eval.bench.results_store import ResultsStore, check_run_info
from ptq_protein.support.errors import BusyError
from ptq_protein.support.io_utils import LOCK_NAME, folder_lock

COLUMNS = ("target", "recipe", "status", "tm_score", "pdb")


def _rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _python(code):
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_eval_processes_into_one_folder_keep_every_row(tmp_path):
    """Different recipes, so a run that rewrote the table from its own copy would drop the other's rows."""
    out = tmp_path / "eval"
    cli = [sys.executable, "-m", "ptq_protein.cli.main", "eval", "contacts", "--model", "tiny-esm2", "--quiet",
           "--set", "cameo139:3", "--out", str(out), "--recipes"]
    first = subprocess.Popen(cli + ["fp,w8-only"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and first.poll() is None:
        lock = out / LOCK_NAME
        if lock.exists() and lock.read_text().strip():
            break  # the first run holds the folder now
        time.sleep(0.05)
    second = subprocess.run(cli + ["fp,w4-only"], capture_output=True, text=True, timeout=600)
    _, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err
    refused = second.returncode == 2 and "in use by pid" in second.stderr
    assert refused or second.returncode == 0, second.stderr
    if refused:
        assert len(second.stderr.strip().splitlines()) == 1
    rows = _rows(out / "results.csv")
    keys = [(r["recipe"], r["target"]) for r in rows]
    wanted = {(r, t) for r in ("fp", "w8-only", *(() if refused else ("w4-only",))) for t in {k[1] for k in keys}}
    assert len(keys) == len(set(keys)) and set(keys) == wanted and len({k[1] for k in keys}) == 3
    assert all(r["status"] == "ok" for r in rows)


def test_several_writers_to_one_table_lose_no_row(tmp_path):
    path = tmp_path / "results.csv"
    code = ("import sys\nfrom ptq_protein.eval.bench.results_store import ResultsStore\n"
            f"store = ResultsStore({str(path)!r}, {COLUMNS!r})\n"
            "for i in range(15):\n"
            "    store.put({'target': f'T{i}', 'recipe': sys.argv[1], 'status': 'ok', 'tm_score': i / 10})\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, f"r{k}"]) for k in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0] * 4
    rows = _rows(path)
    assert sorted((r["recipe"], r["target"]) for r in rows) == sorted((f"r{k}", f"T{i}") for k in range(4)
                                                                      for i in range(15))


def test_a_held_folder_is_refused_and_a_dead_holders_lock_is_taken(tmp_path):
    code = (f"import time\nfrom ptq_protein.support.io_utils import folder_lock\nwith folder_lock({str(tmp_path)!r}):\n"
            "    print('held', flush=True)\n    time.sleep(600)\n")
    holder = _python(code)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BusyError, match=f"pid {holder.pid}"):
            with folder_lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    assert f"pid {holder.pid}" in (tmp_path / LOCK_NAME).read_text()  # the killed holder's lock file is left ...
    with folder_lock(tmp_path):  # ... and is stale: taken over
        assert f"pid {os.getpid()}" in (tmp_path / LOCK_NAME).read_text()


def test_resume_drops_duplicated_truncated_and_garbage_rows(tmp_path, caplog):
    path = tmp_path / "results.csv"
    path.write_text("target,recipe,status,tm_score,pdb\n"
                    "T1,fp,ok,0.087,pdb/fp/T1.pdb\n"
                    "T1,fp,ok,0.087,pdb/fp/T1.pdb\n"      # exact repeat: one copy kept
                    "T2,fp,ok,0.5,pdb/fp/T2.pdb\n"
                    "T2,fp,ok,0.9,pdb/fp/T2.pdb\n"        # conflicting: both dropped, rerun
                    "T3,fp,ok,0.3\n"                      # truncated line
                    "T4,fp,zzz,0.3,x\n"                   # unknown status
                    "T5,fp,ok,abc,x\n"                    # garbage metric
                    "T6,fp,error: boom,,\n")              # a retried error row is valid
    store = ResultsStore(path, COLUMNS)
    assert sorted(r["target"] for r in store) == ["T1", "T6"]
    assert [r["target"] for r in _rows(path)] == ["T1", "T6"], "the repaired table is written back"
    text = caplog.text
    for words in ("repeats", "conflicting", "wrong number of cells", "unknown status", "not a number"):
        assert words in text


def test_a_run_that_scored_nothing_may_change_its_settings(tmp_path):
    check_run_info(tmp_path, {"model": "a", "calibration": "typo.fasta"})
    with pytest.raises(ValueError, match="different run"):
        check_run_info(tmp_path, {"model": "a", "calibration": "good.fasta"})
    check_run_info(tmp_path, {"model": "a", "calibration": "good.fasta"}, scored=False)
    assert json.loads((tmp_path / "run.json").read_text())["calibration"] == "good.fasta"


def test_missing_fp_output_is_rebuilt(tmp_path):
    from ptq_protein.data.sets import load_set
    from ptq_protein.eval.bench.contacts_task import evaluate_contacts
    from ptq_protein.eval.bench.runner import RunOptions
    from ptq_protein.models.loading import load_model

    model, bench = load_model("tiny-esm2").model, load_set("cameo139:2")
    options = RunOptions(calibration=None)
    evaluate_contacts(model, bench, ["fp", "w8-only"], tmp_path, options)
    fp_file = next((tmp_path / "contacts" / "fp").iterdir())
    fp_file.unlink()
    result = evaluate_contacts(model, bench, ["fp", "w8-only"], tmp_path, options)
    assert fp_file.exists() and result["counts"]["ok"] == 1 and result["counts"]["resumed"] == 3
