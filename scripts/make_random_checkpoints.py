"""Write real-size checkpoints with random weights (fair-esm layout) for memory benchmarks.

Toolkit check only: the weights are random, so nothing here measures biology.
Files go under ``--out`` (default /tmp/ptq13_ckpt); never commit them.

    python scripts/make_random_checkpoints.py esm2_150M esm2_650M esmfold_trunk esmc_300m esmc_600m

* ``esm2_150M`` / ``esm2_650M``: ``esm2_t30_150M_UR50D.pt`` / ``esm2_t33_650M_UR50D.pt`` with fair-esm's key
  names and ``cfg`` (argparse.Namespace), as fair-esm's hub files.
* ``esmfold_trunk``: a fair-esm ESMFold file with the v1 trunk (48 folding blocks, structure module) on an
  ESM-2 8M stem; the loader builds its config from the file's partial cfg (trunk: 48 blocks, v1 sizes) and the
  stem's shapes, which equals ``esmfold_trunk_config`` (tested); bench_memory passes it explicitly.

* ``esmc_300m`` / ``esmc_600m``: ``esmc_300m_2024_12_v0.pth`` / ``esmc_600m_2024_12_v0.pth``, ESM C's published
  layout (a bare float32 state dict, as EvolutionaryScale's ``esm/pretrained.py`` reads it) at the published sizes.

Weights: N(0, 1/fan_in) matrices, unit LayerNorm scales, zero biases; buffers keep the
values the model's constructor computes (rotary frequencies, index tables).
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch

SIZES = {"esm2_150M": ("esm2_t30_150M_UR50D", 30, 640, 20), "esm2_650M": ("esm2_t33_650M_UR50D", 33, 1280, 20),
         "esm2_3B": ("esm2_t36_3B_UR50D", 36, 2560, 40)}
TRUNK_FILE = "esmfold_trunk_8M_stem.pt"
ESMC_SIZES = ("esmc_300m", "esmc_600m")


def esmfold_trunk_config():
    """ESMFold v1 trunk (transformers' defaults) on the ESM-2 8M stem (6 layers, 320 wide, 20 heads)."""
    from transformers import EsmConfig

    from ptq_protein.models.esmfold_convert import esmfold_v1_config

    base = esmfold_v1_config().to_dict()
    base.update(num_hidden_layers=6, hidden_size=320, num_attention_heads=20, intermediate_size=1280)
    return EsmConfig(**base)


def _randomize(state, generator):
    out = {}
    for key, value in state.items():
        if not value.is_floating_point() or key.endswith(("inv_freq",)):
            out[key] = value.clone()
        elif value.dim() >= 2:
            out[key] = torch.randn(value.shape, generator=generator) / value.shape[-1] ** 0.5
        elif key.endswith("bias"):
            out[key] = torch.zeros(value.shape)
        else:
            out[key] = torch.ones(value.shape)
    return out


def write_esm2(kind: str, out: Path, seed: int = 0) -> Path:
    import esm
    from esm.model.esm2 import ESM2

    name, layers, dim, heads = SIZES[kind]
    with torch.device("meta"):
        model = ESM2(num_layers=layers, embed_dim=dim, attention_heads=heads,
                     alphabet=esm.data.Alphabet.from_architecture("ESM-1b"), token_dropout=True)
    empty = {k: _inv_freq(dim // heads) if k.endswith("inv_freq") else torch.empty(v.shape)
             for k, v in model.state_dict().items()}
    state = _randomize(empty, torch.Generator().manual_seed(seed))
    state["lm_head.weight"] = state["embed_tokens.weight"]  # tied in fair-esm (stored once)
    body = {("encoder." if k.startswith(("lm_head.", "contact_head.")) else "encoder.sentence_encoder.") + k: v
            for k, v in state.items()}
    cfg = argparse.Namespace(encoder_layers=layers, encoder_embed_dim=dim, encoder_attention_heads=heads,
                             token_dropout=True)
    path = out / f"{name}.pt"
    torch.save({"model": body, "cfg": {"model": cfg}}, path)
    return path


def _inv_freq(head_dim: int) -> torch.Tensor:
    return 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))  # fair-esm RotaryEmbedding


def write_esmfold_trunk(out: Path, seed: int = 0) -> Path:
    from transformers import EsmForProteinFolding

    from ptq_protein.models.esmfold_convert import _skip_init, hf_esmfold_to_fair

    with _skip_init():
        model = EsmForProteinFolding(esmfold_trunk_config())
    state = _randomize(model.state_dict(), torch.Generator().manual_seed(seed))
    del model
    fair = dict(hf_esmfold_to_fair(state).state_dict)
    path = out / TRUNK_FILE
    torch.save({"model": fair, "cfg": {"model": types.SimpleNamespace(trunk={"num_blocks": 48})}}, path)
    return path


def write_esmc(kind: str, out: Path, seed: int = 0) -> Path:
    from ptq_protein.models.esmc import ESMC
    from ptq_protein.models.esmc_load import PUBLISHED_ESMC
    from ptq_protein.models.resolve import ESMC_MODELS

    with torch.device("meta"):
        model = ESMC(*PUBLISHED_ESMC[kind])
    empty = {k: torch.empty(v.shape) for k, v in model.state_dict().items()}
    path = out / ESMC_MODELS[kind][0]
    torch.save(_randomize(empty, torch.Generator().manual_seed(seed)), path)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kinds", nargs="+", choices=[*SIZES, "esmfold_trunk", *ESMC_SIZES])
    parser.add_argument("--out", type=Path, default=Path("/tmp/ptq13_ckpt"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for kind in args.kinds:
        path = (write_esmfold_trunk(args.out) if kind == "esmfold_trunk" else
                write_esmc(kind, args.out) if kind in ESMC_SIZES else write_esm2(kind, args.out))
        sys.stdout.write(f"{kind}: {path} ({path.stat().st_size / 1e9:.2f} GB)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
