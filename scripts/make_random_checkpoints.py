"""Write real-size checkpoints with random weights (fair-esm layout) for memory benchmarks.

Toolkit check only: the weights are random, so nothing here measures biology.
Files go under ``--out`` (default /tmp/ptq13_ckpt); never commit them.

    python scripts/make_random_checkpoints.py esm2_150M esm2_650M esmfold_trunk
    python scripts/make_random_checkpoints.py esm2_35M --outliers --hf

* ``esm2_8M`` ... ``esm2_3B``: ``esm2_t6_8M_UR50D.pt`` ... with fair-esm's key names and ``cfg``
  (argparse.Namespace), as fair-esm's hub files.
* ``--outliers``: also ``<name>-outliers.pt``, the same weights with trained-ESM-like outlier channels planted
  (``ptq_protein.models.outliers``, the tiny demo models' ``OutlierSpec()``).
* ``--hf``: also a transformers ``EsmForMaskedLM`` folder ``<name>-hf/`` (``config.json``, ``model.safetensors``)
  holding the same weights under transformers' names (and ``<name>-outliers-hf/`` with ``--outliers``).
* ``esmfold_trunk``: a fair-esm ESMFold file with the v1 trunk (48 folding blocks, structure module) on an
  ESM-2 8M stem; the loader builds its config from the file's partial cfg (trunk: 48 blocks, v1 sizes) and the
  stem's shapes, which equals ``esmfold_trunk_config`` (tested); bench_memory passes it explicitly.

Weights: N(0, 1/fan_in) matrices, unit LayerNorm scales, zero biases; buffers keep the
values the model's constructor computes (rotary frequencies, index tables).
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch

SIZES = {"esm2_8M": ("esm2_t6_8M_UR50D", 6, 320, 20), "esm2_35M": ("esm2_t12_35M_UR50D", 12, 480, 20),
         "esm2_150M": ("esm2_t30_150M_UR50D", 30, 640, 20), "esm2_650M": ("esm2_t33_650M_UR50D", 33, 1280, 20),
         "esm2_3B": ("esm2_t36_3B_UR50D", 36, 2560, 40)}
TRUNK_FILE = "esmfold_trunk_8M_stem.pt"


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


def esm2_state(kind: str, seed: int = 0, outliers: bool = False) -> dict:
    """fair-esm ``ESM2`` state dict (no ``encoder.`` prefixes) of a ``SIZES`` model with random weights."""
    name, layers, dim, heads = SIZES[kind]
    model = _esm2(kind, "meta")
    empty = {k: _inv_freq(dim // heads) if k.endswith("inv_freq") else torch.empty(v.shape)
             for k, v in model.state_dict().items()}
    state = _randomize(empty, torch.Generator().manual_seed(seed))
    state["lm_head.weight"] = state["embed_tokens.weight"]  # tied in fair-esm (stored once)
    if outliers:
        from ptq_protein.models.outliers import OutlierSpec, plant_outlier_channels_

        model = _esm2(kind, "cpu")
        model.load_state_dict(state, assign=True)
        plant_outlier_channels_(model.embed_tokens, [layer.fc2 for layer in model.layers], OutlierSpec(), seed=seed,
                                tail_tokens=(model.cls_idx, model.eos_idx))
    return state


def write_esm2(kind: str, out: Path, seed: int = 0, outliers: bool = False) -> Path:
    name, layers, dim, heads = SIZES[kind]
    state = esm2_state(kind, seed, outliers)
    body = {("encoder." if k.startswith(("lm_head.", "contact_head.")) else "encoder.sentence_encoder.") + k: v
            for k, v in state.items()}
    cfg = argparse.Namespace(encoder_layers=layers, encoder_embed_dim=dim, encoder_attention_heads=heads,
                             token_dropout=True)
    path = out / f"{name}{'-outliers' if outliers else ''}.pt"
    torch.save({"model": body, "cfg": {"model": cfg}}, path)
    return path


def write_hf_esm2(kind: str, out: Path, seed: int = 0, outliers: bool = False) -> Path:
    """A transformers ``EsmForMaskedLM`` folder with :func:`write_esm2`'s weights (same kind, seed, outliers)."""
    from transformers import EsmForMaskedLM

    from ptq_protein.models.esm_keymap import fair_esm2_to_hf, uses_per_layer_rotary
    from ptq_protein.models.tiny import hf_esm2_config

    name, layers, dim, heads = SIZES[kind]
    with torch.device("meta"):
        model = EsmForMaskedLM(hf_esm2_config(num_layers=layers, embed_dim=dim, heads=heads))
    mapped = fair_esm2_to_hf(esm2_state(kind, seed, outliers), rotary_per_layer=uses_per_layer_rotary(model))
    model.load_state_dict(mapped.state_dict, assign=True, strict=False)
    model.tie_weights()
    meta = [k for k, v in model.state_dict().items() if v.is_meta]
    if meta:
        raise RuntimeError(f"{kind}: transformers names without a fair-esm weight: {meta[:4]}")
    path = out / f"{name}{'-outliers' if outliers else ''}-hf"
    model.save_pretrained(path)
    return path


def _esm2(kind: str, device: str):
    import esm
    from esm.model.esm2 import ESM2

    _, layers, dim, heads = SIZES[kind]
    with torch.device(device):
        return ESM2(num_layers=layers, embed_dim=dim, attention_heads=heads,
                    alphabet=esm.data.Alphabet.from_architecture("ESM-1b"), token_dropout=True)


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kinds", nargs="+", choices=[*SIZES, "esmfold_trunk"])
    parser.add_argument("--out", type=Path, default=Path("/tmp/ptq13_ckpt"))
    parser.add_argument("--outliers", action="store_true", help="ESM-2: also write the planted-outlier variant")
    parser.add_argument("--hf", action="store_true", help="ESM-2: also write transformers folders of the same weights")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for kind in args.kinds:
        if kind == "esmfold_trunk":
            _report(kind, write_esmfold_trunk(args.out))
            continue
        for outliers in (False, True) if args.outliers else (False,):
            _report(kind, write_esm2(kind, args.out, outliers=outliers))
            if args.hf:
                _report(kind, write_hf_esm2(kind, args.out, outliers=outliers))
    return 0


def _report(kind: str, path: Path) -> None:
    size = sum(f.stat().st_size for f in path.rglob("*")) if path.is_dir() else path.stat().st_size
    sys.stdout.write(f"{kind}: {path} ({size / 1e9:.2f} GB)\n")


if __name__ == "__main__":
    sys.exit(main())
