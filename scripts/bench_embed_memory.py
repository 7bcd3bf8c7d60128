"""Peak RSS of embedding with a 650M- or 3B-sized ESM-2 checkpoint: fair-esm's loop (FP32) vs ``ptq-protein embed``.

Random weights in fair-esm's published layout (``make_random_checkpoints.py``, under ``--dir``, never
committed): a toolkit measurement, not biology. Each row runs in a fresh process under ``/usr/bin/time -v``
("Maximum resident set size") over the same FASTA (the first 20 bundled sequences, whole; 100 for 3B):

* fair-esm ``scripts/extract.py``'s loop: ``load_model_and_alphabet_core`` on the loaded file (what
  ``load_model_and_alphabet_local`` does, without the contact-regression file), FP32;
* ``ptq-protein embed`` on the same checkpoint (FP32);
* ``ptq-protein embed`` on its ``w8a8-uniform`` artifact, ``backend="int8"``, quantized with ``--low-memory``
  (streaming writes ``fake`` artifacts: ``embed --backend int8`` runs them on integer GEMMs).

``--size 3B``: a 3B-sized checkpoint (36 x 2560, an 11.4 GB file), 100 sequences, int8 ``embed`` of its
``--low-memory`` artifact only (fair-esm's loop would hold the 11.4 GB of FP32 weights twice, beyond a 24 GiB
machine); the goal is an absolute peak under 4 GiB.

Used by ``bench_embed.py --memory``; runnable alone: ``python scripts/bench_embed_memory.py [--size 3B]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_common import markdown_table  # noqa: E402
from bench_memory import run_timed  # noqa: E402

TOKS, RECIPE = 4096, "w8a8-uniform"


@dataclass(frozen=True)
class Size:
    """One checkpoint size: its random checkpoint, how many sequences, and the goal judged."""

    kind: str  # make_random_checkpoints.py's name
    file: str
    seqs: int
    anchors: bool  # fair-esm's loop and FP32 embed rows (ratio goal) or the int8 row alone (absolute goal)
    goal: float  # x fair-esm's loop with anchors, else GiB


SIZES = {"650M": Size("esm2_650M", "esm2_t33_650M_UR50D.pt", 20, True, 0.4),
         "3B": Size("esm2_3B", "esm2_t36_3B_UR50D.pt", 100, False, 4.0)}

_FAIR_ESM_LOOP = """
import argparse, sys, torch, esm
torch.serialization.add_safe_globals([argparse.Namespace])  # fair-esm's hub files pickle their cfg (torch >= 2.6)
data = torch.load({path!r}, map_location="cpu")  # load_model_and_alphabet_local, minus the contact-regression file
model, alphabet = esm.pretrained.load_model_and_alphabet_core("esm2_t33_650M_UR50D", data)
del data
model.eval()
dataset = esm.FastaBatchedDataset.from_file({fasta!r})
batches = dataset.get_batch_indices({toks}, extra_toks_per_seq=1)
loader = torch.utils.data.DataLoader(dataset, collate_fn=alphabet.get_batch_converter(1022), batch_sampler=batches)
with torch.no_grad():
    for labels, strs, toks in loader:
        out = model(toks, repr_layers=[model.num_layers])["representations"][model.num_layers]
        for i, (label, s) in enumerate(zip(labels, strs)):
            mean = {{model.num_layers: out[i, 1:len(s) + 1].mean(0).clone()}}
            torch.save({{"label": label, "mean_representations": mean}}, f"{out}/{{label}}.pt")
"""


def _fasta(path: Path, seqs: int) -> Path:
    from bench_embed import bundled_records

    path.write_text("".join(f">{label}\n{seq}\n" for label, seq in bundled_records(seqs)))
    return path


def _checkpoint(folder: Path, size: Size) -> Path:
    path = folder / size.file
    if not path.exists():
        subprocess.run([sys.executable, str(HERE / "make_random_checkpoints.py"), size.kind, "--out", str(folder)],
                       check=True)
    return path


def memory_table(folder: Path = Path("/tmp/ptq13_ckpt"), size: str = "650M") -> List[str]:
    """The rows (fresh processes), the int8 row's peak judged against the size's goal."""
    spec = SIZES[size]
    py = [sys.executable]
    cli = py + ["-m", "ptq_protein.cli.main"]
    int8_row = f"embed, {RECIPE} artifact, int8"
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        ckpt, fasta, art = _checkpoint(folder, spec), _fasta(scratch / "seqs.fasta", spec.seqs), scratch / "art"
        quantize = run_timed(cli + ["quantize", str(ckpt), "--preset", RECIPE, "--calib", "casp14:8", "--out",
                                    str(art), "--low-memory", "--quiet", "--check", "0"])
        commands = {int8_row: cli + ["embed", str(art), str(fasta), "--out", str(_fresh(scratch, "int8")),
                                     "--backend", "int8", "--quiet"]}
        if spec.anchors:
            commands = {"fair-esm extract.py loop, FP32 [anchor]":
                        py + ["-c", _FAIR_ESM_LOOP.format(path=str(ckpt), fasta=str(fasta), toks=TOKS,
                                                          out=str(_fresh(scratch, "fair")))],
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
