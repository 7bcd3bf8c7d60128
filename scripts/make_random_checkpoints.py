"""Write real-size checkpoints with random weights (fair-esm layout) for memory benchmarks.

Toolkit check only: the weights are random, so nothing here measures biology.
Files go under ``--out`` (default /tmp/ptq13_ckpt); never commit them.

    python scripts/make_random_checkpoints.py esm2_150M esm2_650M esmfold_trunk esmc_300m esmc_600m
    python scripts/make_random_checkpoints.py esm2_35M --outliers --hf --out /tmp/ckpt/outliers
    python scripts/make_random_checkpoints.py esm2_35M --outliers ln-gain --hf --out /tmp/ckpt/ln-gain

* ``esm2_8M`` ... ``esm2_3B`` (``esm2_quick``: 2 layers x 64, for smoke tests): ``esm2_t30_150M_UR50D.pt`` and so on,
  with fair-esm's key names and ``cfg`` (argparse.Namespace), as fair-esm's hub files, and
  ``NAME-contact-regression.pt`` beside it (random, as the rest), which fair-esm's
  ``load_model_and_alphabet_local`` requires for ESM-2 names.
  ``--outliers [SHAPE]``: trained-ESM-like outliers planted (``ptq_protein.models.outlier_shapes``): alone or
  ``residual``, channels in the token embedding and every layer's FFN output (``ptq_protein.models.outliers``, the
  tiny models' demo strengths); ``ln-gain``, LayerNorm gains feeding attention and the FFN; ``sink``, BOS/EOS
  attention sinks; ``mix``, all three; so activation quantization meets them.
  ``--hf``: the same weights as a Hugging Face folder ``NAME-hf/`` (``EsmForMaskedLM``, safetensors, the ESM
  vocabulary), names mapped by ``ptq_protein.models.esm_keymap``.
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
from typing import Dict, Union

import torch

SIZES = {"esm2_quick": ("esm2_t2_quick", 2, 64, 4),
         "esm2_8M": ("esm2_t6_8M_UR50D", 6, 320, 20), "esm2_35M": ("esm2_t12_35M_UR50D", 12, 480, 20),
         "esm2_150M": ("esm2_t30_150M_UR50D", 30, 640, 20), "esm2_650M": ("esm2_t33_650M_UR50D", 33, 1280, 20),
         "esm2_3B": ("esm2_t36_3B_UR50D", 36, 2560, 40)}
TRUNK_FILE = "esmfold_trunk_8M_stem.pt"
_REGRESSION = ("contact_head.regression.weight", "contact_head.regression.bias")
ESMC_SIZES = ("esmc_300m", "esmc_600m")


def esmfold_trunk_config(blocks: int = 48, stem: str = "esm2_8M"):
    """ESMFold v1 trunk (transformers' defaults, ``blocks`` folding blocks) on an ESM-2 stem of ``SIZES[stem]``'s shape
    (default the 8M stem: 6 layers, 320 wide, 20 heads)."""
    from transformers import EsmConfig

    from ptq_protein.models.esmfold_convert import esmfold_v1_config

    _, layers, dim, heads = SIZES[stem]
    base = esmfold_v1_config().to_dict()
    base.update(num_hidden_layers=layers, hidden_size=dim, num_attention_heads=heads, intermediate_size=4 * dim)
    base["esmfold_config"]["trunk"]["num_blocks"] = blocks
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


def esm2_state(kind: str, seed: int = 0, outliers: Union[bool, str] = False) -> Dict[str, torch.Tensor]:
    """Random weights under fair-esm ``ESM2``'s names (LM head tied to the embedding), with the outlier shape
    ``outliers`` planted (a name of ``OutlierShape``, ``outliers`` = residual; False/True: plain/residual)."""
    import esm
    from esm.model.esm2 import ESM2

    from ptq_protein.models.outlier_shapes import OutlierShape

    _, layers, dim, heads = SIZES[kind]
    alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
    with torch.device("meta"):
        model = ESM2(num_layers=layers, embed_dim=dim, attention_heads=heads, alphabet=alphabet, token_dropout=True)
    empty = {k: _inv_freq(dim // heads) if k.endswith("inv_freq") else torch.empty(v.shape)
             for k, v in model.state_dict().items()}
    state = _randomize(empty, torch.Generator().manual_seed(seed))
    state["lm_head.weight"] = state["embed_tokens.weight"]  # tied in fair-esm (stored once)
    _plant_shape(state, OutlierShape.parse(outliers), layers, heads, alphabet, seed)
    return state


def write_esm2(kind: str, out: Path, seed: int = 0, outliers: Union[bool, str] = False, hf: bool = False) -> Path:
    """``NAME.pt`` and ``NAME-contact-regression.pt`` (fair-esm's published layout), and ``NAME-hf/`` if ``hf``;
    ``outliers``: the planted outlier shape (see :func:`esm2_state`)."""
    name, layers, dim, heads = SIZES[kind]
    state = esm2_state(kind, seed, outliers)
    regression = {k: state.pop(k) for k in _REGRESSION}  # in their own file, as fair-esm publishes them
    body = {("encoder." if k.startswith("lm_head.") else "encoder.sentence_encoder.") + k: v for k, v in state.items()}
    cfg = argparse.Namespace(encoder_layers=layers, encoder_embed_dim=dim, encoder_attention_heads=heads,
                             token_dropout=True)
    path = out / f"{name}.pt"
    torch.save({"model": body, "cfg": {"model": cfg}}, path)
    torch.save({"model": regression}, out / f"{name}-contact-regression.pt")
    if hf:
        write_hf_folder({**state, **regression}, kind, out / f"{name}-hf")
    return path


def write_hf_folder(state: Dict[str, torch.Tensor], kind: str, folder: Path) -> Path:
    """The fair-esm ``state`` as a transformers ``EsmForMaskedLM`` folder (safetensors, config, vocabulary)."""
    from transformers import EsmForMaskedLM

    from ptq_protein.models.esm_keymap import fair_esm2_to_hf, uses_per_layer_rotary
    from ptq_protein.models.tiny import hf_esm2_config
    from ptq_protein.models.tokens import esm_tokenizer

    _, layers, dim, heads = SIZES[kind]
    with torch.device("meta"):
        model = EsmForMaskedLM(hf_esm2_config(num_layers=layers, embed_dim=dim, heads=heads))
    mapped = fair_esm2_to_hf(state, rotary_per_layer=uses_per_layer_rotary(model))
    missing, unexpected = model.load_state_dict(mapped.state_dict, strict=False, assign=True)
    if missing or unexpected or mapped.unknown:
        raise RuntimeError(f"{kind}: HF names missing {list(missing)[:4]}, unexpected {list(unexpected)[:4]}, "
                           f"unmapped fair-esm names {list(mapped.unknown)[:4]}")
    model.tie_weights()
    model.save_pretrained(folder)
    esm_tokenizer().save_pretrained(folder)
    return folder


def _plant_shape(state: Dict[str, torch.Tensor], shape, layers: int, heads: int, alphabet, seed: int) -> None:
    """``shape``'s parts planted on the fair-esm state's tensors, in place: residual channels (the tiny models'
    demo strengths), LayerNorm gains feeding attention and the FFN, attention sinks on BOS/EOS."""
    from torch import nn

    from ptq_protein.models.outlier_shapes import (
        LnGainSpec,
        OutlierShape,
        SinkSpec,
        plant_attention_sink_,
        plant_ln_gain_,
    )
    from ptq_protein.models.outliers import plant_outlier_channels_
    from ptq_protein.models.tiny import DEMO_OUTLIERS

    sinks = (alphabet.cls_idx, alphabet.eos_idx)
    weight = state["embed_tokens.weight"]
    if OutlierShape.RESIDUAL in shape.parts:
        embedding = nn.Embedding(*weight.shape, padding_idx=alphabet.padding_idx, _weight=weight)  # shares storage
        fc2 = []
        for i in range(layers):
            linear = nn.Linear(1, 1, bias=False, device="meta")
            linear.weight = nn.Parameter(state[f"layers.{i}.fc2.weight"], requires_grad=False)  # shares storage
            fc2.append(linear)
        plant_outlier_channels_(embedding, fc2, DEMO_OUTLIERS, seed=seed, tail_tokens=sinks)
    if OutlierShape.LN_GAIN in shape.parts:
        plant_ln_gain_([state[f"layers.{i}.{norm}.weight"] for i in range(layers)
                        for norm in ("self_attn_layer_norm", "final_layer_norm")], LnGainSpec(), seed=seed)
    if OutlierShape.SINK in shape.parts:
        attentions = [(state[f"layers.{i}.self_attn.q_proj.bias"], state[f"layers.{i}.self_attn.k_proj.weight"])
                      for i in range(layers)]
        plant_attention_sink_(weight, attentions, heads, SinkSpec(), seed=seed, sink_tokens=sinks)


def _inv_freq(head_dim: int) -> torch.Tensor:
    return 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))  # fair-esm RotaryEmbedding


def write_esmfold_trunk(out: Path, seed: int = 0) -> Path:
    return write_esmfold(out, seed=seed)


def write_esmfold(out: Path, blocks: int = 48, stem: str = "esm2_8M", seed: int = 0, outliers: bool = False,
                  hf: bool = False) -> Path:
    """A random ESMFold (v1 trunk widths, ``blocks`` blocks, ``stem``'s ESM-2) as fair-esm's file; ``hf``: also as a
    transformers folder beside it (``NAME-hf/``, the same weights). ``outliers``: the stem's planted outlier
    channels (``ptq_protein.models.outliers``, the tiny models' demo strengths)."""
    from transformers import EsmForProteinFolding

    from ptq_protein.models.esmfold_convert import _skip_init, hf_esmfold_to_fair

    with _skip_init():
        model = EsmForProteinFolding(esmfold_trunk_config(blocks, stem))
    state = _randomize(model.state_dict(), torch.Generator().manual_seed(seed))
    model.load_state_dict(state)
    if outliers:
        _plant_stem_outliers(model, seed)
    fair = dict(hf_esmfold_to_fair(model.state_dict()).state_dict)
    name = TRUNK_FILE if (blocks, stem, outliers) == (48, "esm2_8M", False) else \
        f"esmfold_{blocks}b_{stem.split('_')[1]}_stem{'_outliers' if outliers else ''}.pt"
    path = out / name
    torch.save({"model": fair, "cfg": {"model": types.SimpleNamespace(trunk={"num_blocks": blocks})}}, path)
    if hf:
        model.save_pretrained(out / (path.stem + "-hf"))
    return path


def _plant_stem_outliers(model, seed: int) -> None:
    from ptq_protein.models.outliers import plant_outlier_channels_
    from ptq_protein.models.tiny import DEMO_OUTLIERS

    esm = model.esm
    fc2 = [layer.output.dense for layer in esm.encoder.layer]
    with torch.no_grad():
        plant_outlier_channels_(esm.embeddings.word_embeddings, fc2, DEMO_OUTLIERS, seed=seed,
                                tail_tokens=(int(model.esm_dict_cls_idx), int(model.esm_dict_eos_idx)))


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
    from ptq_protein.models.outlier_shapes import SHAPE_NAMES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kinds", nargs="+", choices=[*SIZES, "esmfold_trunk", *ESMC_SIZES])
    parser.add_argument("--out", type=Path, default=Path("/tmp/ptq13_ckpt"))
    parser.add_argument("--outliers", nargs="?", const="residual", default="plain", choices=SHAPE_NAMES,
                        help="ESM-2: plant this outlier shape (models.outlier_shapes; alone: residual channels)")
    parser.add_argument("--hf", action="store_true", help="ESM-2: also write the weights as a Hugging Face folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for kind in args.kinds:
        path = (write_esmfold_trunk(args.out, args.seed) if kind == "esmfold_trunk" else
                write_esmc(kind, args.out, args.seed) if kind in ESMC_SIZES else
                write_esm2(kind, args.out, args.seed, args.outliers, args.hf))
        sys.stdout.write(f"{kind}: {path} ({path.stat().st_size / 1e9:.2f} GB)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
