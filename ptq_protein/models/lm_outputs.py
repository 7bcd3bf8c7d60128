"""One language-model forward with the outputs users take from it, the same for fair-esm and transformers.

Embedding and variant scoring need, from one forward over a batch of tokens,
the hidden states of chosen layers, the logits and the contact map. fair-esm's
``ESM2`` gives them as ``repr_layers`` / ``return_contacts``; transformers'
``EsmModel`` / ``EsmForMaskedLM`` as ``output_hidden_states`` (index ``i`` is
fair-esm's layer ``i``: 0 the embeddings, the last one after the final
LayerNorm) and ``predict_contacts``, which needs eager attention; ptq-protein's
ESM C (:mod:`~ptq_protein.models.esmc`) numbers its ``repr_layers`` as fair-esm does
up to its last block and gives its final LayerNorm an index of its own (one more), and
has no contact head. This module hides those differences; it knows nothing of
files or batching.

Float and quantized models are called the same way (a quantized model keeps
its class), so these functions serve both.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Dict, Iterator, Optional, Sequence

import torch
from torch import nn

__all__ = ["LMOutputs", "LMInfo", "lm_info", "lm_forward", "lm_tokens", "normalize_layers", "eager_attention"]


@dataclass
class LMOutputs:
    """What one forward returned, on the CPU in float32.

    ``representations`` {layer: [B, T, C]}, ``logits`` [B, T, V] (None for a model
    without an LM head), ``contacts`` [B, T-2, T-2] (None unless asked for). ``T``
    counts BOS and EOS; row ``1 + i`` is residue ``i``.
    """

    representations: Dict[int, torch.Tensor] = field(default_factory=dict)
    logits: Optional[torch.Tensor] = None
    contacts: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class LMInfo:
    """What a caller needs to know of a language model before running it."""

    family: str  # "fair-esm", "hf-esm" or "esmc"
    num_layers: int
    embed_dim: int
    heads: int
    has_lm_head: bool
    has_contact_head: bool

    @property
    def last_layer(self) -> int:
        """The highest ``repr_layers`` index (``-1`` counts to it): the final LayerNorm's output. ESM-2 gives it
        ``num_layers``, which is its last block's output after that LayerNorm (fair-esm's numbering); ESM C
        ``num_layers + 1``, so that ``num_layers`` stays its last block's own output."""
        return self.num_layers + 1 if self.family == "esmc" else self.num_layers

    @property
    def layer_words(self) -> str:
        """What the indices ``0..last_layer`` are, in words."""
        if self.family == "esmc":
            return (f"0 = embeddings, 1..{self.num_layers} = the blocks' outputs, {self.last_layer} = the final "
                    "LayerNorm's (the official embeddings)")
        return f"0 = embeddings, {self.num_layers} = after the final LayerNorm"


def lm_info(model: nn.Module) -> LMInfo:
    """:class:`LMInfo` of a fair-esm ``ESM2`` or a transformers ESM language model, or the one a compiled engine
    declares (``model.lm_info``); ``TypeError`` otherwise."""
    if isinstance(getattr(model, "lm_info", None), LMInfo):
        return model.lm_info
    if _is_fair_esm(model):
        args = getattr(model, "args", None)  # ESM-1b / ESM-1v keep their sizes in args

        def size(name: str, arg: str) -> int:
            return int(getattr(model, name, None) or getattr(args, arg))

        return LMInfo("fair-esm", size("num_layers", "layers"), size("embed_dim", "embed_dim"),
                      size("attention_heads", "attention_heads"), True, hasattr(model, "contact_head"))
    if _is_esmc(model):
        return LMInfo("esmc", int(model.num_layers), int(model.d_model), int(model.n_heads), True, False)
    config = getattr(model, "config", None)
    if _hf_encoder(model) is not None and config is not None and not hasattr(model, "trunk"):
        return LMInfo("hf-esm", int(config.num_hidden_layers), int(config.hidden_size),
                      int(config.num_attention_heads), hasattr(model, "lm_head"),
                      getattr(_hf_encoder(model), "contact_head", None) is not None)
    raise TypeError(f"a {type(model).__name__} is not an ESM language model; embeddings and variant scores need "
                    "ESM-2 (fair-esm ESM2, or transformers EsmModel / EsmForMaskedLM) or an artifact quantized "
                    "from one, or ESM C (ptq_protein.models.esmc.ESMC); ESMFold folds: use 'ptq-protein fold'")


def normalize_layers(layers: Sequence[int], num_layers: int, words: str = "0 = embeddings") -> list:
    """fair-esm's ``repr_layers``: ``-1`` is the last layer; each index in ``[-(n+1), n]``, deduplicated, in order.

    ``num_layers``: the highest index (:attr:`LMInfo.last_layer`); ``words``: what the indices are, for the
    message (:attr:`LMInfo.layer_words`).

    >>> normalize_layers([0, -1, 6], 12)
    [0, 12, 6]
    """
    out = []
    for layer in layers:
        if not -(num_layers + 1) <= layer <= num_layers:
            raise ValueError(f"layer {layer} does not exist: this model has layers 0..{num_layers} ({words}; "
                             f"negative counts from the end, -1 = {num_layers})")
        index = (layer + num_layers + 1) % (num_layers + 1)
        if index not in out:
            out.append(index)
    return out


def lm_tokens(sequences: Sequence[str]) -> torch.Tensor:
    """ESM tokens [B, T]: BOS, residues, EOS, then padding (fair-esm's batch converter's layout; ESM C reads the
    same ids, see :mod:`ptq_protein.models.tokens`)."""
    from ptq_protein.models.adapters import _esm_tokens

    return _esm_tokens(sequences)[0]


@torch.no_grad()
def lm_forward(model: nn.Module, tokens: torch.Tensor, repr_layers: Sequence[int] = (), *,
               contacts: bool = False, logits: bool = True) -> LMOutputs:
    """Run ``model`` on ESM ``tokens`` [B, T]; ``repr_layers`` are indices in ``0..last_layer`` (:class:`LMInfo`).

    Padding is masked (transformers: ``attention_mask``; fair-esm masks its padding
    itself). Outputs come back on the CPU in float32, whatever the model's device or dtype.
    ``logits=False`` skips the LM head (``logits`` is then None): embeddings do not read it.
    """
    from ptq_protein.models.adapters import _device_of

    engine = getattr(model, "engine_outputs", None)  # a compiled engine (interop.openvino_engine) runs itself
    if engine is not None:
        return engine(tokens, repr_layers, contacts=contacts, logits=logits)
    info = lm_info(model)
    device = _device_of(model)
    tokens = tokens.to(device)
    if info.family == "fair-esm":
        with contextlib.nullcontext() if logits else _without_lm_head(model):
            out = model(tokens, repr_layers=list(repr_layers), return_contacts=contacts)
        reps = {int(k): v for k, v in out["representations"].items()}
        return _to_cpu(LMOutputs(reps, out["logits"] if logits else None, out.get("contacts") if contacts else None))
    if contacts and not info.has_contact_head:
        raise ValueError(f"{type(model).__name__} has no contact head; leave 'contacts' out")
    if info.family == "esmc":
        out = model(tokens, repr_layers=list(repr_layers))
        reps = {int(k): v for k, v in out["representations"].items()}
        return _to_cpu(LMOutputs(reps, out["logits"] if logits else None, None))
    if not logits and info.has_lm_head:  # the encoder alone: the same hidden states, no head
        model, info = _hf_encoder(model), dataclasses.replace(info, has_lm_head=False)
    return _to_cpu(_hf_forward(model, tokens, repr_layers, contacts, info))


class _NoHead(nn.Module):
    """Stands in for fair-esm's LM head, which ``ESM2.forward`` always runs: returns its input unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@contextlib.contextmanager
def _without_lm_head(model: nn.Module) -> Iterator[None]:
    head = model.lm_head
    model.lm_head = _NoHead()
    try:
        yield
    finally:
        model.lm_head = head


def _hf_forward(model: nn.Module, tokens: torch.Tensor, repr_layers: Sequence[int], contacts: bool,
                info: LMInfo) -> LMOutputs:
    from ptq_protein.models.adapters import _esm_alphabet

    mask = (tokens != _esm_alphabet().padding_idx).long()
    with eager_attention(model, contacts):
        out = model(input_ids=tokens, attention_mask=mask, output_hidden_states=bool(repr_layers),
                    output_attentions=contacts, return_dict=True)
    reps = {layer: out.hidden_states[layer] for layer in repr_layers}
    contact_map = None
    if contacts:  # transformers' EsmModel.predict_contacts, from this forward's attentions
        attns = torch.stack(out.attentions, dim=1)
        attns = attns * mask[:, None, None, :, None] * mask[:, None, None, None, :]
        contact_map = _hf_encoder(model).contact_head(tokens, attns.to(torch.float32))
    return LMOutputs(reps, getattr(out, "logits", None) if info.has_lm_head else None, contact_map)


@contextlib.contextmanager
def eager_attention(model: nn.Module, needed: bool = True) -> Iterator[None]:
    """transformers' SDPA returns no attention maps (the contact head needs them): switch to eager attention for
    this call only, and restore the model's setting after it. A no-op for fair-esm models and when not needed."""
    old = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if not needed or old in (None, "eager") or not hasattr(model, "set_attn_implementation"):
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(old)


def _is_fair_esm(model: nn.Module) -> bool:
    return any(cls.__name__ in ("ESM2", "ProteinBertModel") for cls in type(model).__mro__)


def _is_esmc(model: nn.Module) -> bool:
    from ptq_protein.models.esmc import ESMC

    return isinstance(model, ESMC)


def _hf_encoder(model: nn.Module) -> Optional[nn.Module]:
    """The ``EsmModel`` of a transformers ESM language model (itself, or its ``.esm``)."""
    names = {cls.__name__ for cls in type(model).__mro__}
    if "EsmModel" in names:
        return model
    esm = getattr(model, "esm", None)
    return esm if esm is not None and "EsmModel" in {c.__name__ for c in type(esm).__mro__} else None


def _to_cpu(out: LMOutputs) -> LMOutputs:
    def cpu(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if t is None else t.detach().to("cpu", torch.float32)

    return LMOutputs({k: cpu(v) for k, v in out.representations.items()}, cpu(out.logits), cpu(out.contacts))
