"""Tiny random ESM-2 / ESMFold models built from the real library classes, deterministic from a seed.

They stand in for the real checkpoints (which cannot be downloaded here) in
tests and demos: same modules, same state-dict names, same forward code, a
few thousand to a few hundred thousand parameters, CPU forward in milliseconds.

* :func:`tiny_esm2` -- fair-esm ``esm.model.esm2.ESM2`` + its ESM-1b alphabet.
* :func:`tiny_hf_esm2` -- transformers ``EsmForMaskedLM`` holding *the same
  weights* as ``tiny_esm2`` with the same arguments (renamed through
  :mod:`ptq_protein.models.esm_keymap`), so the two libraries can be compared.
* :func:`tiny_esmfold` -- transformers ``EsmForProteinFolding`` (``fp16_esm=False``)
  whose ESM-2 stem is ``tiny_esm2(seed, num_layers=2, embed_dim=32, heads=4)``.
* :func:`tiny_esmc` -- ptq-protein's ESM C (:class:`~ptq_protein.models.esmc.ESMC`, the official
  module names and forward), 2 blocks x 64, 4 heads.

Weights: every parameter is redrawn by :func:`seeded_init_` from a private
``torch.Generator(seed)`` in ``named_parameters()`` order, so results do not
depend on the global RNG or on the libraries' own init (which zeroes the
ESMFold "final" layers and would make the trunk an identity). By default
(:data:`DEMO_OUTLIERS`) trained-ESM-like outlier channels are planted in the
ESM-2 stem; pass ``outliers=None`` for a plain random model.

Registry names for ``load_model``: ``tiny-esm2``, ``tiny-esm2-hf``, ``tiny-esmfold``, ``tiny-esmc``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import nn

from ptq_protein.models.esm_keymap import fair_esm2_to_hf, uses_per_layer_rotary
from ptq_protein.models.esmc import ESMC
from ptq_protein.models.outliers import OutlierSpec, plant_outlier_channels_
from ptq_protein.models.tokens import esm_tokenizer, esm_vocab, esmc_vocab, esmfold_tokenizer

__all__ = [
    "DEMO_OUTLIERS",
    "TinySpec",
    "TINY_MODELS",
    "tiny_esm2",
    "tiny_hf_esm2",
    "tiny_esmfold",
    "tiny_esmfold_config",
    "tiny_esmc",
    "hf_esm2_config",
    "build_tiny",
    "seeded_init_",
]

#: Outlier channels planted in the registry's ("demo") tiny models.
DEMO_OUTLIERS = OutlierSpec()
_LN_WEIGHT_STD = 0.1  # LayerNorm gains 1 + N(0, 0.1): non-trivial but well conditioned
_BIAS_STD = 0.02
_OTHER_STD = 0.1
# fair-esm ESM2 and transformers use torch's LayerNorm default eps (convert_esm.py sets the same).
_ESM_LAYER_NORM_EPS = 1e-5
_TINY_RECYCLES = 1


def tiny_esm2(seed: int = 0, num_layers: int = 2, embed_dim: int = 64, heads: int = 4,
              token_dropout: bool = True, outliers: Optional[OutlierSpec] = DEMO_OUTLIERS):
    """A seeded fair-esm ``ESM2`` in eval mode and its alphabet.

    Parameters
    ----------
    seed
        Determines every weight (and the planted channels).
    num_layers, embed_dim, heads
        ``ESM2`` constructor arguments; the FFN is ``4 * embed_dim`` wide as in ESM-2.
    token_dropout
        As in ESM-2 (embeddings rescaled by the share of ``<mask>`` tokens).
    outliers
        Outlier channels to plant (:class:`OutlierSpec`), or None.

    Returns
    -------
    (esm.model.esm2.ESM2, esm.data.Alphabet)

    Examples
    --------
    >>> model, alphabet = tiny_esm2(seed=0)
    >>> _, _, tokens = alphabet.get_batch_converter()([("p", "MKTAYIAK")])
    >>> model(tokens)["logits"].shape
    torch.Size([1, 10, 33])
    """
    import esm
    from esm.model.esm2 import ESM2

    alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
    model = _construct(lambda: ESM2(num_layers=num_layers, embed_dim=embed_dim, attention_heads=heads,
                                    alphabet=alphabet, token_dropout=token_dropout), seed)
    seeded_init_(model, seed)
    if outliers is not None:
        plant_outlier_channels_(model.embed_tokens, [layer.fc2 for layer in model.layers], outliers, seed=seed,
                                tail_tokens=(alphabet.cls_idx, alphabet.eos_idx))
    return model.eval(), alphabet


def tiny_hf_esm2(seed: int = 0, num_layers: int = 2, embed_dim: int = 64, heads: int = 4,
                 token_dropout: bool = True, outliers: Optional[OutlierSpec] = DEMO_OUTLIERS):
    """``EsmForMaskedLM`` (rotary, 33-token ESM vocab) with the weights of ``tiny_esm2`` (same arguments).

    Returns
    -------
    (transformers.EsmForMaskedLM, transformers.EsmTokenizer)
    """
    from transformers import EsmForMaskedLM

    fair, _ = tiny_esm2(seed, num_layers, embed_dim, heads, token_dropout, outliers)
    config = hf_esm2_config(num_layers=num_layers, embed_dim=embed_dim, heads=heads, token_dropout=token_dropout)
    model = _construct(lambda: EsmForMaskedLM(config), seed)
    mapped = fair_esm2_to_hf(fair.state_dict(), rotary_per_layer=uses_per_layer_rotary(model))
    _load_exact(model, mapped.state_dict, "tiny_hf_esm2")
    return model.eval(), esm_tokenizer()


def tiny_esmfold(seed: int = 0, outliers: Optional[OutlierSpec] = DEMO_OUTLIERS):
    """A seeded ``EsmForProteinFolding`` with :func:`tiny_esmfold_config` (CPU, float32).

    Returns
    -------
    (transformers.EsmForProteinFolding, transformers.EsmTokenizer over the AF2 vocabulary)
    """
    from transformers import EsmForProteinFolding

    config = tiny_esmfold_config()
    model = _construct(lambda: EsmForProteinFolding(config), seed)
    seeded_init_(model, seed)
    fair, _ = tiny_esm2(seed, config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                        config.token_dropout, outliers)
    stem = fair_esm2_to_hf(fair.state_dict(), head_prefix=None, rotary_per_layer=uses_per_layer_rotary(model))
    missing, unexpected = model.load_state_dict(stem.state_dict, strict=False)
    stray = [k for k in missing if k.startswith("esm.")] + list(unexpected)
    if stray:
        raise RuntimeError(f"tiny_esmfold: ESM-2 stem keys do not line up: {stray[:8]}")
    return model.eval(), esmfold_tokenizer()


def tiny_esmc(seed: int = 0, num_layers: int = 2, d_model: int = 64, heads: int = 4,
              outliers: Optional[OutlierSpec] = DEMO_OUTLIERS):
    """A seeded ESM C (:class:`~ptq_protein.models.esmc.ESMC`) in eval mode and its vocabulary.

    Outlier channels are planted as in :func:`tiny_esm2`: in the token embedding (BOS/EOS the tail) and in the
    rows of each block's SwiGLU output linear (``ffn.3``).

    Returns
    -------
    (ESMC, tuple of the 33 ESM C tokens in id order)

    Examples
    --------
    >>> model, vocab = tiny_esmc(seed=0)
    >>> model(torch.tensor([[vocab.index("<cls>"), vocab.index("M"), vocab.index("<eos>")]]))["logits"].shape
    torch.Size([1, 3, 64])
    """
    model = _construct(lambda: ESMC(d_model=d_model, n_heads=heads, n_layers=num_layers), seed)
    seeded_init_(model, seed)
    if outliers is not None:
        plant_outlier_channels_(model.embed, [block.ffn[3] for block in model.transformer.blocks], outliers,
                                seed=seed, tail_tokens=(model.bos_id, model.eos_id))
    return model.eval(), esmc_vocab()


def tiny_esmfold_config():
    """The tiny ``EsmConfig``: ESM-2 stem 2 layers x 32 (FFN 128), trunk 2 blocks, structure module 2 blocks.

    ``max_recycles=1`` (v1: 4). With ``num_recycles=None`` transformers runs the trunk
    ``max_recycles`` times (tiny: once, v1: four times; the extra first pass is added only
    to an explicit ``num_recycles=n``, which runs it n + 1 times), so on its own pass the
    tiny trunk's recycle norms see only zeros; ``num_recycles=1`` exercises recycling.
    ``chunk_size=None`` (fair-esm's default; transformers' is 128): the trunk runs
    unchunked, as calibration runs it, so a study-exact recipe's statistics can be
    observed in the forwards of our own batch-1 pass (``shared_calibration``).
    """
    from transformers import EsmConfig

    trunk = dict(num_blocks=2, sequence_state_dim=64, pairwise_state_dim=32, sequence_head_width=16,
                 pairwise_head_width=16, max_recycles=_TINY_RECYCLES, chunk_size=None,
                 structure_module=dict(sequence_dim=64, pairwise_dim=32, num_blocks=2, ipa_dim=16, num_heads_ipa=4))
    config = hf_esm2_config(num_layers=2, embed_dim=32, heads=4, token_dropout=True)
    return EsmConfig(**{**config.to_dict(), "is_folding_model": True, "vocab_list": list(esm_vocab()),
                        "esmfold_config": dict(fp16_esm=False, trunk=trunk)})


def hf_esm2_config(num_layers: int, embed_dim: int, heads: int, token_dropout: bool = True):
    """``EsmConfig`` of an ESM-2 as transformers' converter writes it (rotary, eps 1e-5, no dropout)."""
    from transformers import EsmConfig

    vocab = esm_vocab()
    return EsmConfig(vocab_size=len(vocab), hidden_size=embed_dim, num_hidden_layers=num_layers,
                     num_attention_heads=heads, intermediate_size=4 * embed_dim,
                     pad_token_id=vocab.index("<pad>"), mask_token_id=vocab.index("<mask>"),
                     position_embedding_type="rotary", emb_layer_norm_before=False, token_dropout=token_dropout,
                     layer_norm_eps=_ESM_LAYER_NORM_EPS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     max_position_embeddings=1026)


@torch.no_grad()
def seeded_init_(model: nn.Module, seed: int) -> nn.Module:
    """Redraw every parameter of ``model`` from ``torch.Generator(seed)``, in ``named_parameters()`` order.

    Embeddings ~ N(0, 1) (padding row zero), matrices ~ N(0, 1/fan_in), LayerNorm-like
    vectors ~ 1 + N(0, 0.1), biases ~ N(0, 0.02), anything else ~ N(0, 0.1). Buffers are kept.
    """
    generator = torch.Generator().manual_seed(seed)
    embeddings = {id(m.weight): m for m in model.modules() if isinstance(m, nn.Embedding)}
    for name, param in model.named_parameters():
        draw = torch.randn(param.shape, generator=generator, dtype=torch.float64)
        if id(param) in embeddings:
            value = draw
        elif name.endswith("bias"):
            value = _BIAS_STD * draw
        elif param.dim() == 1 and name.endswith("weight"):
            value = 1.0 + _LN_WEIGHT_STD * draw
        elif param.dim() == 2:
            value = draw / math.sqrt(param.shape[1])
        else:
            value = _OTHER_STD * draw
        param.copy_(value.to(param.dtype))
        padding = getattr(embeddings.get(id(param)), "padding_idx", None)
        if padding is not None:
            param[padding].zero_()
    return model


@dataclasses.dataclass(frozen=True)
class TinySpec:
    """A registry entry: the family ``load_model`` reports and the factory (``seed=`` -> (model, vocab))."""

    family: str
    factory: Callable[..., Tuple[nn.Module, Any]]
    description: str


TINY_MODELS: Dict[str, TinySpec] = {
    "tiny-esm2": TinySpec("fair-esm", tiny_esm2, "fair-esm ESM2, 2 layers x 64, 4 heads, demo outliers"),
    "tiny-esm2-hf": TinySpec("hf-esm", tiny_hf_esm2, "transformers EsmForMaskedLM, same weights as tiny-esm2"),
    "tiny-esmfold": TinySpec("hf-esmfold", tiny_esmfold, "transformers EsmForProteinFolding, 2x32 stem, 2 blocks"),
    "tiny-esmc": TinySpec("esmc", tiny_esmc, "ESM C (ptq-protein's, the official layout), 2 blocks x 64, 4 heads"),
}


def build_tiny(name: str, seed: int = 0) -> Tuple[nn.Module, Any, TinySpec]:
    """Build a registry model by name; returns (model, alphabet or tokenizer, spec)."""
    if name not in TINY_MODELS:
        raise ValueError(f"unknown tiny model {name!r}; choose one of {', '.join(TINY_MODELS)}")
    spec = TINY_MODELS[name]
    model, vocab = spec.factory(seed=seed)
    return model, vocab, spec


# --- helpers -------------------------------------------------------------------


def _construct(build: Callable[[], nn.Module], seed: int) -> nn.Module:
    """Run a model constructor (which draws from the global RNG) without changing the caller's RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def _load_exact(model: nn.Module, state_dict: Dict[str, torch.Tensor], what: str) -> None:
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"{what}: missing keys {list(missing)[:8]}, unexpected keys {list(unexpected)[:8]}")
