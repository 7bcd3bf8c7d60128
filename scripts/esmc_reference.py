#!/usr/bin/env python
"""Reference outputs of EvolutionaryScale's own ``ESMC`` class on a seeded random checkpoint (a test fixture).

Runs in its own virtual environment, never beside ptq-protein: the official package installs a module named
``esm``, as fair-esm does, and pins transformers < 4.48.2. The recipe (what ``esm/models/esmc.py`` imports;
``--no-deps`` because of those pins):

    python -m venv /work/venv-esmc
    /work/venv-esmc/bin/pip install torch==2.13.0
    /work/venv-esmc/bin/pip install --no-deps esm==3.2.1.post1
    /work/venv-esmc/bin/pip install attrs einops huggingface_hub numpy zstd cloudpathlib tenacity pandas scipy \\
        tokenizers "transformers<4.48.2" biotite brotli msgpack-numpy biopython httpx
    /work/venv-esmc/bin/python scripts/esmc_reference.py --out tests/models/data/esmc_reference

It builds the official ``ESMC`` (``use_flash_attn=False``: the torch attention path) at a tiny size, fills its
state dict from a seed with :func:`random_state_dict` (torch only, so ptq-protein's test rebuilds the same
checkpoint instead of committing it), tokenizes a few sequences with the official tokenizer, masks one
position, and writes:

* ``outputs.safetensors``: ``tokens`` [B, T] as the official ``_tokenize`` builds them, ``input`` (the same with
  the masked position), and the official forward's ``sequence_logits`` [B, T, 64], ``embeddings`` [B, T, C] and
  ``hidden_states`` [n_layers, B, T, C] (each block's output);
* ``reference.json``: the config, seed, sequences, the masked position, the sha256 of the generated state dict
  and the versions used.

Nothing from ptq-protein is imported here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Dict, Sequence

import torch

CONFIG = {"d_model": 32, "n_heads": 2, "n_layers": 3}
SEED = 46
SEQUENCES = ["MKTAYIAKQRQISFVKSHFSRQ", "ACDEFGHIKLMNPQRSTVWYXBUZO", "MENDELKKLLAA"]
MASKED = (2, 5)  # (row, token position) set to <mask> before the forward


def random_state_dict(names_and_shapes: Dict[str, Sequence[int]], seed: int) -> Dict[str, torch.Tensor]:
    """Seeded float32 weights for an ESM C state dict, drawn in sorted key order from ``torch.Generator(seed)``.

    ``embed.weight`` ~ N(0, 1); matrices ~ N(0, 1/fan_in); other ``*.weight`` vectors (LayerNorm gains) ~
    1 + N(0, 0.1); biases ~ N(0, 0.02).
    """
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name in sorted(names_and_shapes):
        shape = tuple(names_and_shapes[name])
        draw = torch.randn(shape, generator=generator, dtype=torch.float64)
        if name == "embed.weight":
            value = draw
        elif len(shape) == 2:
            value = draw / shape[1] ** 0.5
        elif name.endswith("bias"):
            value = 0.02 * draw
        else:
            value = 1.0 + 0.1 * draw
        state[name] = value.to(torch.float32)
    return state


def state_sha256(state: Dict[str, torch.Tensor]) -> str:
    """sha256 over every (name, shape, float32 bytes) in sorted name order."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to(torch.float32).contiguous()
        digest.update(f"{name}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for outputs.safetensors and reference.json")
    args = parser.parse_args(list(argv))
    from esm.models.esmc import ESMC
    from esm.tokenization import get_esmc_model_tokenizers
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = ESMC(**CONFIG, tokenizer=get_esmc_model_tokenizers(), use_flash_attn=False).eval()
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    state = random_state_dict(shapes, SEED)
    model.load_state_dict(state, strict=True)
    tokens = model._tokenize(SEQUENCES)
    forward_input = tokens.clone()
    forward_input[MASKED] = model.tokenizer.mask_token_id
    with torch.no_grad():
        out = model(sequence_tokens=forward_input)
    tensors = {"tokens": tokens, "input": forward_input, "sequence_logits": out.sequence_logits,
               "embeddings": out.embeddings, "hidden_states": out.hidden_states}
    args.out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(args.out / "outputs.safetensors"))
    info = {"config": CONFIG, "seed": SEED, "sequences": SEQUENCES, "masked": list(MASKED),
            "state_sha256": state_sha256(state), "official_class": "esm.models.esmc.ESMC (use_flash_attn=False)",
            "versions": {"esm": _version("esm"),
                         "torch": torch.__version__, "python": sys.version.split()[0]},
            "vocab": list(model.tokenizer.convert_ids_to_tokens(range(model.tokenizer.vocab_size)))}
    (args.out / "reference.json").write_text(json.dumps(info, indent=1) + "\n")
    (args.out / "outputs.safetensors").chmod(0o644)
    print(f"official ESMC {CONFIG}, seed {SEED}, state sha256 {info['state_sha256'][:16]}...; "
          f"{len(SEQUENCES)} sequences, tokens {tuple(tokens.shape)}; wrote {args.out}")
    for name, tensor in tensors.items():
        if tensor.is_floating_point():
            print(f"  {name:<16} {tuple(tensor.shape)}  mean {tensor.mean():+.5f}  std {tensor.std():.5f}  "
                  f"max |x| {tensor.abs().max():.4f}")
    return 0


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
