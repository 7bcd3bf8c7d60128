"""Audit of what ``embed``, ``fold`` and ``score`` write and read back: is an output folder judged by content?

Each case builds its situation on tiny seeded models (toolkit checks, no biology), runs the real
CLI in a subprocess, and prints ``case | expected | got | OK/BAD``. The cases are those of the
round-6 audit about outputs (foreign, damaged and colliding files; fold shards of two models;
two concurrent HDF5 runs; ``--dms /dev/zero``; one-line refusals).

Run it with the interpreter whose ptq-protein you want to audit, as a file (not ``-m``, so that
the working tree is not put first on the path)::

    python scripts/audit_outputs.py                 # every case
    python scripts/audit_outputs.py foreign-pt h5-perms   # some cases

Exit status: the number of BAD cases (0: all OK).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

from audit_kit import (  # noqa: E402  (scripts/ is this file's folder: the audit's shared pieces)
    CASES,
    SEQS,
    Ran,
    case,
    cli,
    embed,
    fasta,
    read,
    read_ok,
    refused,
    write_fair_esm2,
)

# --- section 1: a folder is judged by content ----------------------------------------------------------------


def _foreign(work: Path, fmt: str, damage: Callable[[Path, Path], Path]) -> Tuple[str, bool]:
    seqs = fasta(work)
    ours, theirs = work / "ours", work / "theirs"
    for out, seed in ((ours, "0"), (theirs, "1")):
        embed(work, "tiny-esm2", seqs, out, "--format", fmt, "--seed", seed)
    want = read(ours)
    victim = damage(ours, theirs)
    reading, read_fine = read_ok(read(ours), want, victim.name)
    rerun = embed(work, "tiny-esm2", seqs, ours, "--format", fmt, "--seed", "0")
    after, after_fine = read_ok(read(ours), want, victim.name)
    fixed = (rerun.rc == 0 and after_fine and "max diff" in after) or refused(rerun, victim.name)
    return f"read before rerun: {reading}; rerun {rerun.said()}; then {after}", read_fine and fixed


@case("foreign-pt", "a.pt of another model copied in: rerun recomputes it (read = this model) or refuses naming it")
def foreign_pt(work: Path):
    return _foreign(work, "pt", lambda ours, theirs: Path(shutil.copy(theirs / "a.pt", ours / "a.pt")))


@case("foreign-h5", "an h5 shard of another model copied in: recomputed, or refused naming the file")
def foreign_h5(work: Path):
    name = "embeddings.1-of-1.h5"
    return _foreign(work, "h5", lambda ours, theirs: Path(shutil.copy(theirs / name, ours / name)))


def _damaged(how: str):
    def damage(ours: Path, theirs: Path) -> Path:
        path = ours / "a.pt"
        if how == "truncated":
            path.write_bytes(path.read_bytes()[:200])
        elif how == "empty":
            path.write_bytes(b"")
        else:  # a pickle that would run code when unpickled (here: print a marker)
            path.write_bytes(pickle.dumps(_Marker()))
        return path
    return damage


class _Marker:
    def __reduce__(self):
        return print, ("UNPICKLED-USER-FILE",)


for _how in ("truncated", "empty", "pickled"):
    case(f"damaged-pt-{_how}", f"a {_how} a.pt: read names it; rerun recomputes it or refuses naming it")(
        lambda work, how=_how: _foreign(work, "pt", _damaged(how)))


def _damaged_h5(how: str):
    def damage(ours: Path, theirs: Path) -> Path:
        path = ours / "embeddings.1-of-1.h5"
        path.write_bytes(path.read_bytes()[:300] if how == "truncated" else b"garbage " * 100)
        return path
    return damage


for _how in ("truncated", "garbage"):
    case(f"damaged-h5-{_how}", f"a {_how} h5 shard: read names it (no raw OSError); rerun recomputes or refuses")(
        lambda work, how=_how: _foreign(work, "h5", _damaged_h5(how)))


@case("contact-regression", "-contact-regression.pt edited, one output deleted: rerun refused (model differs) "
                            "or every contact map from one head")
def contact_regression(work: Path):
    import torch

    seqs, ckpt, out = fasta(work), write_fair_esm2(work / "m.pt"), work / "o"
    embed(work, ckpt, seqs, out, "--include", "contacts")
    regression = work / "m-contact-regression.pt"
    data = torch.load(regression, weights_only=True)
    data["model"] = {k: v * 2 + 0.1 for k, v in data["model"].items()}
    torch.save(data, regression)
    (out / "a.pt").unlink()
    rerun = embed(work, ckpt, seqs, out, "--include", "contacts")
    if rerun.rc == 2:  # refused for what changed: the head's file, not the model's name
        return rerun.said(), refused(rerun, "model") and "model.name" not in rerun.err
    fresh = work / "fresh"
    embed(work, ckpt, seqs, fresh, "--include", "contacts")
    got, want = read(out), read(fresh)
    diff = max(float((got[k]["contacts"] - want[k]["contacts"]).abs().max()) for k in want)
    return f"{rerun.said()}; contacts vs a fresh run: max diff {diff:.3g}", diff == 0


@case("artifact-default-backend", "two artifacts with the same tensors, default backends fake and int8: the second "
                                  "is refused into the first's folder (outputs of two backends never mixed)")
def artifact_backend(work: Path):
    seqs = fasta(work)
    arts = {b: work / f"art-{b}" for b in ("fake", "int8")}
    for backend, art in arts.items():
        cli(work, "quantize", "tiny-esm2", "--preset", "w8a8-dynamic", "--backend", backend, "--check", "0", "--out",
            art, "--quiet")
    embed(work, arts["fake"], seqs, work / "o")
    (work / "o" / "a.pt").unlink()
    ran = embed(work, arts["int8"], seqs, work / "o")
    return ran.said(), refused(ran, "model")


@case("resume-checkpoint-path", "embed of a checkpoint file, rerun unchanged: resumes (exit 0, nothing computed)")
def resume_path(work: Path):
    seqs, ckpt = fasta(work), write_fair_esm2(work / "m.pt")
    first = embed(work, ckpt, seqs, work / "o")
    again = embed(work, ckpt, seqs, work / "o")
    return f"first exit {first.rc}; rerun {again.said()} {again.out.strip()[:80]}", \
        again.rc == 0 and "embedded 0 sequences" in again.out


@case("two-ids-one-file", "ids 'a/b' and the stem written for it: both read back, or refused naming both")
def two_ids_one_file(work: Path):
    from ptq_protein.support.io_utils import safe_stem

    stem = safe_stem("a/b")
    seqs = fasta(work, {"a/b": SEQS["a"], stem: SEQS["b"]})
    ran = embed(work, "tiny-esm2", seqs, work / "o")
    if ran.rc == 2:
        return ran.said(), refused(ran, "a/b")
    got = read(work / "o")
    if isinstance(got, Exception):
        return f"{ran.said()}; read raised {got}", False
    return f"{ran.said()}; {len(got)} of 2 records read back ({stem})", set(got) == {"a/b", stem}


@case("fold-shards-two-models", "fold --shard 2/2 with another seed into shard 1/2's folder: refused in one line")
def fold_shards(work: Path):
    seqs, out = fasta(work), work / "folds"
    first = cli(work, "fold", "tiny-esmfold", "--fasta", seqs, "--out", out, "--shard", "1/2", "--quiet")
    second = cli(work, "fold", "tiny-esmfold", "--fasta", seqs, "--out", out, "--shard", "2/2", "--seed", "1",
                 "--quiet")
    return f"shard 1/2 exit {first.rc}; seed 1 shard 2/2 {second.said()}", first.rc == 0 and refused(second)


@case("eval-variants-foreign", "eval variants: a scores .npy of another model copied over a done row's: the rerun "
                               "redoes the row (the file is this model's again)")
def eval_foreign(work: Path):
    seqs = fasta(work, {"a": SEQS["a"], "b": SEQS["b"]})
    runs = {seed: work / f"ev{seed}" for seed in ("0", "1")}
    for seed, out in runs.items():
        cli(work, "eval", "variants", "--model", "tiny-esm2", "--recipes", "fp", "--set", seqs, "--out", out,
            "--seed", seed, "--quiet")
    ours = runs["0"] / "variants" / "fp" / "a.npy"
    want = ours.read_bytes()
    shutil.copy(runs["1"] / "variants" / "fp" / "a.npy", ours)
    rerun = cli(work, "eval", "variants", "--model", "tiny-esm2", "--recipes", "fp", "--set", seqs, "--out",
                runs["0"], "--seed", "0", "--quiet")
    same = ours.read_bytes() == want
    return f"rerun {rerun.said()}; a.npy {'is this model' if same else 'still the other model'}'s", \
        rerun.rc == 0 and same


# --- section 3: concurrency, devices ------------------------------------------------------------------------


@case("concurrent-h5", "two identical --format h5 runs into one folder: both finish, or one refuses in one line; "
                       "every sequence read back")
def concurrent_h5(work: Path):
    import random

    rng = random.Random(0)
    letters = "ACDEFGHIKLMNPQRSTVWY"
    seqs = fasta(work, {f"s{i}": "".join(rng.choice(letters) for _ in range(rng.randint(8, 40)))
                        for i in range(200)})
    out = work / "o"
    cmd = [sys.executable, "-m", "ptq_protein.cli.main", "embed", "tiny-esm2", str(seqs), "--out", str(out),
           "--format", "h5", "--toks-per-batch", "64", "--quiet"]
    procs = [subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    runs = [Ran(p.wait(300), *p.communicate(), 0.0) for p in procs]
    got = read(out)
    count = "read raised" if isinstance(got, Exception) else f"{len(got)} of 200 read back"
    fine = [r.rc == 0 or refused(r) for r in runs] == [True, True] and any(r.rc == 0 for r in runs)
    return f"{'; '.join(r.said() for r in runs)}; {count}", fine and not isinstance(got, Exception) and len(got) == 200


@case("score-dms-dev-zero", "score --dms /dev/zero: refused in one line (not a regular file), no hang")
def score_dev_zero(work: Path):
    ran = cli(work, "score", "tiny-esm2", "--sequence", SEQS["a"], "--dms", "/dev/zero", "--out", work / "s.csv",
              "--quiet", timeout=60)
    return f"{ran.said()} after {ran.seconds:.0f} s", refused(ran, "/dev/zero")


# --- section 4: minor ---------------------------------------------------------------------------------------


def _pt_run(work: Path) -> Tuple[Path, Path]:
    seqs, out = fasta(work), work / "o"
    embed(work, "tiny-esm2", seqs, out)
    return seqs, out


@case("manifest-garbage", "embed_run.json garbage: read and rerun each one line naming the file")
def manifest_garbage(work: Path):
    seqs, out = _pt_run(work)
    (out / "embed_run.json").write_text("{not json")
    got, rerun = read(out), embed(work, "tiny-esm2", seqs, out)
    clear = not isinstance(got, dict) and "embed_run.json" in str(got) and type(got).__name__ != "JSONDecodeError"
    return f"read: {type(got).__name__}: {str(got)[:100]}; rerun {rerun.said()}", clear and refused(rerun,
                                                                                                    "embed_run.json")


@case("manifest-format-edited", "embed_run.json 'format' edited to h5 on a pt folder: read refuses, not {}")
def manifest_format(work: Path):
    seqs, out = _pt_run(work)
    manifest = json.loads((out / "embed_run.json").read_text())
    manifest["options"]["format"] = "h5"
    (out / "embed_run.json").write_text(json.dumps(manifest))
    got = read(out)
    if isinstance(got, dict):
        return f"read returned {len(got)} records", False
    return f"read: {type(got).__name__}: {str(got)[:140]}", "embed_run.json" in str(got) or ".pt" in str(got)


@case("repr-layers-refusal", "rerun with another --repr-layers: the refusal names both values (no 'None')")
def repr_layers(work: Path):
    seqs, out = _pt_run(work)
    ran = embed(work, "tiny-esm2", seqs, out, "--repr-layers", "0")
    return ran.said(), refused(ran, "repr_layers") and "None" not in ran.err


@case("dangling-out-link", "--out a dangling symlink: one line saying so (not 'File exists')")
def dangling_out(work: Path):
    (work / "link").symlink_to(work / "nowhere")
    ran = embed(work, "tiny-esm2", fasta(work), work / "link")
    return ran.said(), refused(ran) and "File exists" not in ran.err and "link" in ran.err


@case("max-memory-1K", "--max-memory 1K: one line before the model loads (not a line per sequence)")
def max_memory(work: Path):
    ran = embed(work, "tiny-esm2", fasta(work), work / "o", "--max-memory", "1K")
    return ran.said(), refused(ran, "--max-memory") and not (work / "o" / "embed_run.json").exists()


@case("world-size-rank", "WORLD_SIZE=2 RANK=5: the message names RANK / WORLD_SIZE, not '--shard 6/2'")
def world_size_rank(work: Path):
    ran = embed(work, "tiny-esm2", fasta(work), work / "o", env={"WORLD_SIZE": "2", "RANK": "5"})
    return ran.said(), refused(ran, "RANK") and "--shard 6/2" not in ran.err


@case("dms-without-dms-score", "eval variants --dms without DMS_score: the hint names DMS_score, not --mutation-col")
def dms_without_score(work: Path):
    seqs = fasta(work, {"a": SEQS["a"]})
    (work / "dms.csv").write_text("mutant,fitness\nM1A,0.5\nK2A,0.1\n")
    ran = cli(work, "eval", "variants", "--model", "tiny-esm2", "--set", seqs, "--dms", work / "dms.csv", "--out",
              work / "ev", "--quiet")
    return ran.said(), refused(ran, "DMS_score") and "--mutation-col" not in ran.err


@case("artifact-dtype-F4", "an artifact whose header says dtype F4: one line naming the dtype (not 'sub-byte')")
def artifact_f4(work: Path):
    from ptq_protein.support.digests import file_sha256

    art = work / "art"
    cli(work, "quantize", "tiny-esm2", "--preset", "w8a8-uniform", "--out", art, "--quiet")
    tensors = art / "model.safetensors"
    raw = bytearray(tensors.read_bytes())
    (size,) = struct.unpack("<Q", raw[:8])
    header = raw[8:8 + size].replace(b'"dtype":"I8"', b'"dtype":"F4"', 1)
    tensors.write_bytes(bytes(raw[:8] + header + raw[8 + size:]))
    recipe = json.loads((art / "recipe.json").read_text())
    recipe["files"]["model.safetensors"] = {"sha256": file_sha256(tensors), "bytes": tensors.stat().st_size}
    (art / "recipe.json").write_text(json.dumps(recipe))
    ran = embed(work, art, fasta(work), work / "o")
    return ran.said(), refused(ran) and ("'F4'" in ran.err or "dtype F4" in ran.err) and "sub-byte" not in ran.err


@case("duplicate-fasta-id", "a repeated FASTA id: the hint is an option the CLI has, and it works")
def duplicate_id(work: Path):
    seqs = work / "dup.fasta"
    seqs.write_text(f">T1085\n{SEQS['a']}\n>T1085\n{SEQS['b']}\n")
    ran = embed(work, "tiny-esm2", seqs, work / "o")
    if not refused(ran, "T1085"):
        return ran.said(), False
    if "--duplicates rename" not in ran.err:  # fine if it names no option at all (rename them by hand)
        return ran.said(), "duplicates='rename'" not in ran.err
    again = embed(work, "tiny-esm2", seqs, work / "o", "--duplicates", "rename")
    got = read(work / "o")
    shown = sorted(got) if isinstance(got, dict) else got
    return f"{ran.said()}; with --duplicates rename {again.said()}, read {shown}", \
        again.rc == 0 and isinstance(got, dict) and set(got) == {"T1085", "T1085#2"}


@case("h5-perms", "--format h5 under umask 0022: rw-r--r-- as the .pt files")
def h5_perms(work: Path):
    seqs = fasta(work)
    old = os.umask(0o022)
    try:
        embed(work, "tiny-esm2", seqs, work / "h5", "--format", "h5")
        embed(work, "tiny-esm2", seqs, work / "pt")
    finally:
        os.umask(old)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in [*(work / "h5").glob("*.h5"), work / "pt" / "a.pt"]}
    return str(modes), set(modes.values()) == {"0o644"}


# --- driver ---------------------------------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    args = parser.parse_args(argv)
    import ptq_protein

    chosen = [c for c in CASES if not args.cases or c[0] in args.cases]
    print(f"ptq-protein from {Path(ptq_protein.__file__).parent} ({sys.executable})")
    print("| case | expected | got | |\n|---|---|---|---|")
    bad = 0
    for name, expected, fn in chosen:
        with tempfile.TemporaryDirectory(prefix="audit-") as tmp:
            try:
                got, ok = fn(Path(tmp))
            except Exception as err:  # noqa: BLE001 -- a case that cannot even be set up is BAD, with why
                got, ok = f"audit case raised {type(err).__name__}: {err}", False
        bad += not ok
        print(f"| {name} | {expected} | {' '.join(got.split()).replace('|', '/')} | {'OK' if ok else 'BAD'} |",
              flush=True)
    print(f"\n{len(chosen) - bad} OK, {bad} BAD")
    return bad


if __name__ == "__main__":
    sys.exit(main())
