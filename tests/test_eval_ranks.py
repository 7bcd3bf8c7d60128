"""``eval`` under torchrun: two CPU ranks (gloo) give the rows of one process, and a killed rank's work resumes.

Every run is a subprocess with ``OMP_NUM_THREADS=1`` (torchrun's default for
its workers), so one process and two ranks compute with the same thread count
and their rows can be compared cell for cell (``seconds`` aside). tiny-esm2
contacts on three bundled cameo139 targets: each run takes a few seconds.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from ptq_protein.eval.bench.distributed import Ranks

ARGS = ["eval", "contacts", "--model", "tiny-esm2", "--set", "cameo139:3", "--recipes", "fp,w8-only,w8a8-uniform"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
# rank 1 dies (as if killed) at its first quantized target: after the shared fp rows, before its own rows.
DYING_RANK = """
import os, sys
from ptq_protein.eval.bench import contacts_task
real = contacts_task._predict_and_score
def dying(model, bench, target, recipe, out_dir):
    if os.environ["RANK"] == "1" and recipe != "fp":
        os._exit(9)
    return real(model, bench, target, recipe, out_dir)
contacts_task._predict_and_score = dying
from ptq_protein.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _run(command, out, extra=()):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*command, *ARGS, "--out", str(out), *extra], capture_output=True, text=True, env=env,
                          timeout=300)


def _rows(out):
    """The table as a set of rows (order-independent), without the timing column."""
    with open(out / "results.csv", newline="") as handle:
        return {tuple((k, v) for k, v in sorted(row.items()) if k != "seconds") for row in csv.DictReader(handle)}


def _keys(rows):
    return {(dict(r)["recipe"], dict(r)["target"]) for r in rows}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "eval"
    done = _run([sys.executable, "-m", "ptq_protein.cli.main"], out)
    assert done.returncode == 0, done.stderr
    rows = _rows(out)
    assert len(rows) == 9 and all(dict(r)["status"] == "ok" for r in rows)
    return rows


def test_two_ranks_write_the_rows_of_one_process(one_process, tmp_path):
    done = _run([*TORCHRUN, "-m", "ptq_protein.cli.main"], tmp_path / "eval")
    assert done.returncode == 0, done.stderr
    assert _rows(tmp_path / "eval") == one_process
    assert done.stdout.count("rows scored") == 1, "rank 0 alone reports"
    assert "9 rows scored, 0 skipped (length cap), 0 failed, 0 already done" in done.stdout, "counts of both ranks"
    for rank in ("0/2", "1/2"):
        assert f"rank {rank} ptq_protein.eval.bench.runner: w8" in done.stderr, "both ranks scored quantized rows"
    assert (tmp_path / "eval" / "summary.md").exists()


def test_a_killed_rank_resumes_with_one_process_computing_only_the_missing_rows(one_process, tmp_path):
    out = tmp_path / "eval"
    script = tmp_path / "dying_rank.py"
    script.write_text(DYING_RANK)
    killed = _run([*TORCHRUN, str(script)], out)
    assert killed.returncode != 0
    partial = _rows(out)
    assert partial < one_process, "whatever was written is a right row"
    assert {k for k in _keys(partial) if k[0] == "fp"} == {k for k in _keys(one_process) if k[0] == "fp"}
    missing = _keys(one_process) - _keys(partial)
    assert {k for k in missing if k[0] == "w8a8-uniform"}, "rank 1's share was lost with it"

    resumed = _run([sys.executable, "-m", "ptq_protein.cli.main"], out, extra=["--json"])
    assert resumed.returncode == 0, resumed.stderr
    counts = json.loads(resumed.stdout)["counts"]
    assert counts == {"ok": len(missing), "skipped": 0, "error": 0, "resumed": len(partial)}
    assert _rows(out) == one_process


def test_a_refusal_on_rank_0_stops_every_rank_and_keeps_the_table(tmp_path):
    out = tmp_path / "eval"
    first = _run([sys.executable, "-m", "ptq_protein.cli.main"], out, extra=["--targets", "7EQH_A"])
    assert first.returncode == 0, first.stderr
    before = (out / "results.csv").read_bytes()
    other = _run([*TORCHRUN, "-m", "ptq_protein.cli.main"], out, extra=["--targets", "7EQH_A", "--seed", "3"])
    assert other.returncode != 0
    assert "holds results of a different run" in other.stderr
    assert "rank 0 stopped the run" in other.stderr, "rank 1 ends with rank 0's reason, not a hang"
    assert (out / "results.csv").read_bytes() == before


@pytest.mark.parametrize("n_items,world", [(0, 2), (1, 2), (5, 2), (9, 4), (3, 3), (7, 1)])
def test_shares_are_contiguous_balanced_and_cover_every_item_once(n_items, world):
    items = list(range(n_items))
    shares = [Ranks(rank=r, world_size=world).share(items) for r in range(world)]
    assert [i for share in shares for i in share] == items
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_single_process_changes_nothing():
    ranks = Ranks()
    assert not ranks.shared and ranks.is_main and ranks.device("cuda") == "cuda"
    assert ranks.gather("x") == ["x"]
    assert Ranks(rank=1, world_size=2, local_rank=1).device("cuda") == "cuda:1"
    with pytest.raises(ValueError, match="not a valid placement"):
        Ranks(rank=2, world_size=2)


def test_structure_under_two_ranks_gives_the_rows_of_one_process(tmp_path):
    """eval structure takes the same path (its wiring: ranks, rank-0 summary); the cross-rank FP reads are
    exercised by the contacts runs above (3 targets: rank 0 scores a quantized target whose FP rank 1 wrote)."""
    args = ["eval", "structure", "--model", "tiny-esmfold", "--set", "cameo139:2", "--recipes", "fp,w8-only",
            "--num-recycles", "0", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name, launcher in (("one", [sys.executable]), ("two", TORCHRUN)):
        done = subprocess.run([*launcher, "-m", "ptq_protein.cli.main", *args, "--out", str(tmp_path / name)],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
    assert _rows(tmp_path / "one") == _rows(tmp_path / "two")
    assert len(_rows(tmp_path / "two")) == 4
