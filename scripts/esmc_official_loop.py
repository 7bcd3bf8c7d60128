#!/usr/bin/env python
"""EvolutionaryScale's own ESM C embedding loop, FP32 or BF16, for ``bench_esmc_embed.py`` (in the official venv).

What a user of the official package writes: one protein at a time, ``model.encode(ESMProtein(sequence=s))``
then ``model.logits(..., LogitsConfig(sequence=True, return_embeddings=True))``, the mean of ``embeddings``
over the residues kept. The model is the official ``ESMC`` (``use_flash_attn=False``; flash-attn needs CUDA)
holding a state dict in the official layout, in float32, or cast with ``.to(torch.bfloat16)`` for ``--dtype
bfloat16`` (what a user does for bf16 on a CPU: the class autocasts on CUDA only). Prints one JSON line
(residues, seconds of the loop without the model load) and writes the per-sequence means (float32) to ``--means``
(safetensors) for the bench to compare with ptq-protein's. Nothing from ptq-protein is imported: the official
package's ``esm`` and fair-esm's cannot share an environment (see scripts/esmc_reference.py for the venv recipe).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence


def read_fasta(path: Path):
    records, label, parts = [], None, []
    for line in path.read_text().splitlines():
        if line.startswith(">"):
            if label is not None:
                records.append((label, "".join(parts)))
            label, parts = line[1:].split()[0], []
        elif line.strip():
            parts.append(line.strip())
    if label is not None:
        records.append((label, "".join(parts)))
    return records


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", type=Path, required=True)
    p.add_argument("--fasta", type=Path, required=True)
    p.add_argument("--means", type=Path, required=True)
    p.add_argument("--d-model", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = p.parse_args(list(argv))
    import torch
    from esm.models.esmc import ESMC
    from esm.sdk.api import ESMProtein, LogitsConfig
    from esm.tokenization import get_esmc_model_tokenizers
    from safetensors.torch import save_file

    torch.set_num_threads(args.threads)
    model = ESMC(args.d_model, args.heads, args.layers, tokenizer=get_esmc_model_tokenizers(),
                 use_flash_attn=False).eval()
    model.load_state_dict(torch.load(args.weights, map_location="cpu", weights_only=True))
    model = model.to(getattr(torch, args.dtype))
    records = read_fasta(args.fasta)
    best, means = None, {}
    for _ in range(args.reps):
        start = time.perf_counter()
        for label, seq in records:
            out = model.logits(model.encode(ESMProtein(sequence=seq)),
                               LogitsConfig(sequence=True, return_embeddings=True))
            means[label] = out.embeddings[0, 1:len(seq) + 1].float().mean(0)
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    save_file({k: v.contiguous() for k, v in means.items()}, str(args.means))
    print(json.dumps({"residues": sum(len(s) for _, s in records), "seconds": best, "sequences": len(records)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
