"""Peak RSS of embedding with an ESM-2 650M-sized checkpoint: fair-esm's loop (FP32) against ``ptq-protein embed``.

Random weights in fair-esm's published layout (``make_random_checkpoints.py``, under ``--dir``, never
committed): a toolkit measurement, not biology. Each row runs in a fresh process under ``/usr/bin/time -v``
("Maximum resident set size") over the same FASTA (the first ``SEQS`` bundled sequences, whole):

* fair-esm ``scripts/extract.py``'s loop: ``load_model_and_alphabet_core`` on the loaded file (what
  ``load_model_and_alphabet_local`` does, without the contact-regression file), FP32;
* ``ptq-protein embed`` on the same checkpoint (FP32);
* ``ptq-protein embed`` on its ``w8a8-uniform`` artifact, ``backend="int8"``, quantized with ``--low-memory``
  (streaming writes ``fake`` artifacts: ``embed --backend int8`` runs them on integer GEMMs).

Used by ``bench_embed.py --memory``; runnable alone: ``python scripts/bench_embed_memory.py``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_common import markdown_table  # noqa: E402
from bench_memory import run_timed  # noqa: E402

KIND, FILE = "esm2_650M", "esm2_t33_650M_UR50D.pt"
SEQS, TOKS, GOAL = 20, 4096, 0.4
RECIPE = "w8a8-uniform"

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


def _fasta(path: Path) -> Path:
    from bench_embed import bundled_records

    path.write_text("".join(f">{label}\n{seq}\n" for label, seq in bundled_records(SEQS)))
    return path


def _checkpoint(folder: Path) -> Path:
    path = folder / FILE
    if not path.exists():
        subprocess.run([sys.executable, str(HERE / "make_random_checkpoints.py"), KIND, "--out", str(folder)],
                       check=True)
    return path


def memory_table(folder: Path = Path("/tmp/ptq13_ckpt")) -> List[str]:
    """The three rows (fresh processes), the int8 row's ratio to fair-esm's loop, and the goal judged."""
    py = [sys.executable]
    cli = py + ["-m", "ptq_protein.cli.main"]
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        ckpt, fasta, art = _checkpoint(folder), _fasta(scratch / "seqs.fasta"), scratch / "art"
        quantize = run_timed(cli + ["quantize", str(ckpt), "--preset", RECIPE, "--calib", "casp14:8", "--out",
                                    str(art), "--low-memory", "--quiet", "--check", "0"])
        rows = {}
        for name, cmd in (
                ("fair-esm extract.py loop, FP32 [anchor]",
                 py + ["-c", _FAIR_ESM_LOOP.format(path=str(ckpt), fasta=str(fasta), toks=TOKS,
                                                   out=str(_fresh(scratch, "fair")))]),
                ("embed, FP32 checkpoint", cli + ["embed", str(ckpt), str(fasta), "--out", str(_fresh(scratch, "fp")),
                                                  "--quiet"]),
                (f"embed, {RECIPE} artifact, int8", cli + ["embed", str(art), str(fasta), "--out",
                                                           str(_fresh(scratch, "int8")), "--backend", "int8",
                                                           "--quiet"])):
            rows[name] = run_timed(cmd)
    anchor = rows["fair-esm extract.py loop, FP32 [anchor]"]["rss_gib"]
    table = [[name, f"{r['rss_gib']:.2f}", f"{r['rss_gib'] / anchor:.2f}x", f"{r['wall_s']:.0f}"]
             for name, r in rows.items()]
    ratio = rows[f"embed, {RECIPE} artifact, int8"]["rss_gib"] / anchor
    return [f"\n### Peak RSS, ESM-2 650M-sized random checkpoint ({ckpt.stat().st_size / 2**30:.2f} GiB file), "
            f"{SEQS} sequences\n",
            f"quantize --low-memory: peak RSS {quantize['rss_gib']:.2f} GiB, {quantize['wall_s']:.0f} s\n",
            markdown_table(["row", "peak RSS GiB", "vs fair-esm loop", "wall s"], table),
            f"\nint8 embed peak RSS {ratio:.2f}x fair-esm's loop "
            f"(goal <= {GOAL}x: {'met' if ratio <= GOAL else 'missed'})"]


def _fresh(scratch: Path, name: str) -> Path:
    path = scratch / name
    path.mkdir()
    return path


if __name__ == "__main__":
    print("\n".join(memory_table()))
