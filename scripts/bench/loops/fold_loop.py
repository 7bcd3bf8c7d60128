#!/usr/bin/env python3
"""A plain transformers ESMFold loop over a FASTA: what a user writes without this toolkit (a whole process each).

``EsmForProteinFolding.from_pretrained(folder)``, the stem in float32 (transformers keeps ``fp16_esm`` for CUDA;
on a CPU users run it in float32), ``torch.no_grad()``, one ``model.infer_pdb(sequence)`` per record written to
``OUT/LABEL.pdb``. ``--bf16-stem`` casts the ESM-2 stem to bfloat16 (``model.esm.to(torch.bfloat16)``): the
perturbation control of the fold bench. It imports nothing from this toolkit (only its sibling loop's FASTA reader).
"""

import argparse
import pathlib

import torch
from hf_loop import read_fasta  # the embed bench's plain reader, beside this file (labels: whole headers)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", help="a transformers EsmForProteinFolding folder")
    parser.add_argument("fasta")
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--bf16-stem", action="store_true")
    args = parser.parse_args()
    from transformers import EsmForProteinFolding

    model = EsmForProteinFolding.from_pretrained(args.model).eval()
    model.esm = model.esm.to(torch.bfloat16 if args.bf16_stem else torch.float32)
    args.out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        for label, sequence in read_fasta(args.fasta):
            (args.out / f"{label}.pdb").write_text(model.infer_pdb(sequence))


if __name__ == "__main__":
    main()
