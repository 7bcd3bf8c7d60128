"""Peak RSS of embedding with a 650M- or 3B-sized ESM-2 checkpoint: fair-esm's loop (FP32) vs ``ptq-protein embed``.

Random weights in fair-esm's published layout (``make_random_checkpoints.py``, under ``--dir``, never
committed): a toolkit measurement, not biology. Each row is a fresh process whose peak RSS is the child's
``ru_maxrss`` (``os.wait4``, what ``/usr/bin/time -v`` reports), over the same FASTA (the first 20 bundled
sequences, whole; 100 for 3B):

* fair-esm's ``scripts/extract.py`` (``loops/extract.py``: ``load_model_and_alphabet_local``), FP32;
* ``ptq-protein embed`` on the same checkpoint (FP32);
* ``ptq-protein embed`` on its ``w8a8-uniform`` artifact as typed (no ``--backend``: the default path),
  quantized with ``--low-memory``.

``--size 3B``: a 3B-sized checkpoint (36 x 2560, an 11.4 GB file), 100 sequences, int8 ``embed`` of its
``--low-memory`` artifact only (fair-esm's loop would hold the 11.4 GB of FP32 weights twice, beyond a 24 GiB
machine); the goal is an absolute peak under 4 GiB.

Used by ``python -m scripts.bench embed --memory``; alone: ``python -m scripts.bench embed_memory [--size 3B]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from bench.common import SCRIPTS, bundled_records, markdown_table, run_timed, write_fasta
from bench.prepare import cli as cli_command

TOKS, RECIPE = 4096, "w8a8-uniform"


@dataclass(frozen=True)
class Size:
    """One checkpoint size: its random checkpoint, how many sequences, and the goal judged."""

    kind: str  # make_random_checkpoints.py's name
    file: str
    seqs: int
    anchors: bool  # fair-esm's loop and FP32 embed rows (ratio goal) or the int8 row alone (absolute goal)
    goal: float  # x fair-esm's loop with anchors, else GiB


SIZES = {"650M": Size("esm2_650M", "esm2_t33_650M_UR50D.pt", 20, True, 0.3),
         "3B": Size("esm2_3B", "esm2_t36_3B_UR50D.pt", 100, False, 4.0)}


def _checkpoint(folder: Path, size: Size) -> Path:
    """The checkpoint and its contact-regression file (fair-esm's loader needs both), written when missing."""
    path = folder / size.file
    if not (path.exists() and path.with_name(f"{path.stem}-contact-regression.pt").exists()):
        subprocess.run([sys.executable, str(SCRIPTS / "make_random_checkpoints.py"), size.kind, "--out", str(folder)],
                       check=True)
    return path


def memory_table(folder: Path = Path("/tmp/ptq13_ckpt"), size: str = "650M") -> List[str]:
    """The rows (fresh processes), the int8 row's peak judged against the size's goal."""
    spec = SIZES[size]
    py, cli = [sys.executable], cli_command()
    int8_row = f"embed, {RECIPE} artifact (as typed)"
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        ckpt, art = _checkpoint(folder, spec), scratch / "art"
        fasta = write_fasta(scratch / "seqs.fasta", bundled_records(spec.seqs))
        quantize = run_timed(cli + ["quantize", str(ckpt), "--preset", RECIPE, "--calib", "casp14:8", "--out",
                                    str(art), "--low-memory", "--quiet", "--check", "0"])
        commands = {int8_row: cli + ["embed", str(art), str(fasta), "--out", str(_fresh(scratch, "int8")), "--quiet"]}
        if spec.anchors:
            commands = {"fair-esm extract.py loop, FP32 [anchor]":
                        py + [str(SCRIPTS / "bench" / "loops" / "extract.py"), str(ckpt), str(fasta),
                              str(_fresh(scratch, "fair")), "--include", "mean", "--toks_per_batch", str(TOKS)],
                        "embed, FP32 checkpoint": cli + ["embed", str(ckpt), str(fasta), "--out",
                                                         str(_fresh(scratch, "fp")), "--quiet"],
                        **commands}
        rows = {name: run_timed(cmd) for name, cmd in commands.items()}
    peak = rows[int8_row]["rss_gib"]
    anchor = rows.get("fair-esm extract.py loop, FP32 [anchor]", {}).get("rss_gib")
    table = [[name, f"{r['rss_gib']:.2f}", f"{r['rss_gib'] / anchor:.2f}x" if anchor else "-", f"{r['wall_s']:.0f}"]
             for name, r in rows.items()]
    value, unit = (peak / anchor, "x fair-esm's loop") if anchor else (peak, "GiB")
    return [f"\n### Peak RSS, ESM-2 {size}-sized random checkpoint ({ckpt.stat().st_size / 2**30:.2f} GiB file), "
            f"{spec.seqs} sequences\n",
            f"quantize --low-memory: peak RSS {quantize['rss_gib']:.2f} GiB, {quantize['wall_s']:.0f} s\n",
            markdown_table(["row", "peak RSS GiB", "vs fair-esm loop", "wall s"], table),
            f"\nint8 embed peak RSS {value:.2f} {unit} "
            f"(goal <= {spec.goal} {unit}: {'met' if value <= spec.goal else 'missed'})"]


def _fresh(scratch: Path, name: str) -> Path:
    path = scratch / name
    path.mkdir()
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="650M", help="checkpoint size (default 650M)")
    p.add_argument("--dir", type=Path, default=Path("/tmp/ptq13_ckpt"),
                   help="where the random checkpoints are (made there when missing; never committed)")
    args = p.parse_args(argv)
    print("\n".join(memory_table(args.dir, args.size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
