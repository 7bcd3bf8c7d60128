"""State-dict names of ESM-2: fair-esm ``ESM2`` <-> transformers ``EsmModel``/``EsmForMaskedLM``.

One table, read in both directions. It was derived from transformers'
``convert_esm.py`` (which copies fair-esm modules into the HF ones by
attribute) and checked key-for-key against both installed libraries in
``tests/models/test_esm_keymap.py``.

=====================================  ===============================================
fair-esm ``ESM2``                      transformers (``{enc}`` = ``esm.``, ``{head}`` = ``lm_head.``)
=====================================  ===============================================
embed_tokens                           {enc}embeddings.word_embeddings
layers.i.self_attn.{q,k,v}_proj        {enc}encoder.layer.i.attention.self.{query,key,value}
layers.i.self_attn.out_proj            {enc}encoder.layer.i.attention.output.dense
layers.i.self_attn_layer_norm          {enc}encoder.layer.i.attention.LayerNorm
layers.i.fc1 / fc2                     {enc}encoder.layer.i.intermediate.dense / output.dense
layers.i.final_layer_norm              {enc}encoder.layer.i.LayerNorm
layers.i.self_attn.rot_emb.inv_freq    {enc}rotary_embeddings.inv_freq (transformers 5, shared) or
                                       {enc}encoder.layer.i.attention.self.rotary_embeddings.inv_freq (4.x)
emb_layer_norm_after                   {enc}encoder.emb_layer_norm_after
contact_head.regression                {enc}contact_head.regression
lm_head.weight (tied to embed_tokens)  {head}decoder.weight
lm_head.{bias,dense,layer_norm}        {head}{bias,dense,layer_norm}
=====================================  ===============================================

ESM-1b/1v (learned positions) use other names and are not covered.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Dict, List, Mapping, Optional, Tuple

import torch

__all__ = ["KeyMapping", "fair_esm2_to_hf", "hf_to_fair_esm2", "fair_name_to_hf", "uses_per_layer_rotary"]

# (fair-esm name, transformers name, scope): "{i}" is a layer index, "{p}" weight|bias.
_TABLE: Tuple[Tuple[str, str, str], ...] = (
    ("embed_tokens.weight", "embeddings.word_embeddings.weight", "enc"),
    ("layers.{i}.self_attn.q_proj.{p}", "encoder.layer.{i}.attention.self.query.{p}", "enc"),
    ("layers.{i}.self_attn.k_proj.{p}", "encoder.layer.{i}.attention.self.key.{p}", "enc"),
    ("layers.{i}.self_attn.v_proj.{p}", "encoder.layer.{i}.attention.self.value.{p}", "enc"),
    ("layers.{i}.self_attn.out_proj.{p}", "encoder.layer.{i}.attention.output.dense.{p}", "enc"),
    ("layers.{i}.self_attn_layer_norm.{p}", "encoder.layer.{i}.attention.LayerNorm.{p}", "enc"),
    ("layers.{i}.fc1.{p}", "encoder.layer.{i}.intermediate.dense.{p}", "enc"),
    ("layers.{i}.fc2.{p}", "encoder.layer.{i}.output.dense.{p}", "enc"),
    ("layers.{i}.final_layer_norm.{p}", "encoder.layer.{i}.LayerNorm.{p}", "enc"),
    ("emb_layer_norm_after.{p}", "encoder.emb_layer_norm_after.{p}", "enc"),
    ("contact_head.regression.{p}", "contact_head.regression.{p}", "enc"),
    ("lm_head.weight", "decoder.weight", "head"),
    ("lm_head.bias", "bias", "head"),
    ("lm_head.dense.{p}", "dense.{p}", "head"),
    ("lm_head.layer_norm.{p}", "layer_norm.{p}", "head"),
)
_FAIR_ROTARY = re.compile(r"layers\.(\d+)\.self_attn\.rot_emb\.inv_freq")
_HF_ROTARY_SHARED = "rotary_embeddings.inv_freq"
_HF_ROTARY_LAYER = re.compile(r"encoder\.layer\.(\d+)\.attention\.self\.rotary_embeddings\.inv_freq")


@dataclasses.dataclass(frozen=True)
class KeyMapping:
    """Result of a rename: the renamed tensors, and source names left out (``dropped``) or unknown."""

    state_dict: Dict[str, torch.Tensor]
    dropped: Tuple[str, ...] = ()
    unknown: Tuple[str, ...] = ()


def fair_esm2_to_hf(state_dict: Mapping[str, torch.Tensor], *, enc_prefix: str = "esm.",
                    head_prefix: Optional[str] = "lm_head.", rotary_per_layer: bool = False) -> KeyMapping:
    """Rename a fair-esm ESM-2 state dict (no ``encoder.`` prefixes) to transformers names.

    Parameters
    ----------
    state_dict
        ``ESM2.state_dict()`` names.
    enc_prefix
        Prefix of the encoder in the target model (``"esm."`` for both
        ``EsmForMaskedLM`` and ``EsmForProteinFolding``; ``""`` for a bare ``EsmModel``).
    head_prefix
        Prefix of the LM head, or None to drop the fair-esm LM head (ESMFold has none).
    rotary_per_layer
        True for transformers 4.x, which keeps one ``inv_freq`` per layer.
    """
    forward = {fair: (hf, scope) for fair, hf, scope in _expand_table(state_dict)}
    out: Dict[str, torch.Tensor] = {}
    dropped: List[str] = []
    unknown: List[str] = []
    for name, tensor in state_dict.items():
        rotary = _FAIR_ROTARY.fullmatch(name)
        if rotary:
            target = (f"encoder.layer.{rotary.group(1)}.attention.self.rotary_embeddings.inv_freq"
                      if rotary_per_layer else _HF_ROTARY_SHARED)
            _put_same(out, enc_prefix + target, tensor, name)
        elif name in forward:
            hf, scope = forward[name]
            if scope == "head" and head_prefix is None:
                dropped.append(name)
            else:
                out[(enc_prefix if scope == "enc" else head_prefix) + hf] = tensor
        else:
            unknown.append(name)
    return KeyMapping(out, tuple(dropped), tuple(unknown))


def hf_to_fair_esm2(state_dict: Mapping[str, torch.Tensor], *, enc_prefix: str = "esm.",
                    head_prefix: Optional[str] = "lm_head.") -> KeyMapping:
    """Rename transformers ESM-2 names (under ``enc_prefix``/``head_prefix``) to fair-esm ``ESM2`` names.

    Keys outside both prefixes (e.g. the ESMFold trunk, or everything but the
    encoder when ``head_prefix`` is None) are returned in ``dropped``; a shared
    rotary ``inv_freq`` is copied to every fair-esm layer.
    """
    local: Dict[Tuple[str, str], torch.Tensor] = {}
    dropped: List[str] = []
    for name, tensor in state_dict.items():
        if name.startswith(enc_prefix):
            local[("enc", name[len(enc_prefix):])] = tensor
        elif head_prefix is not None and name.startswith(head_prefix):
            local[("head", name[len(head_prefix):])] = tensor
        else:
            dropped.append(name)
    hf_names = {n for _, n in local}
    backward = {(scope, hf): fair for fair, hf, scope in _expand_table(hf_names)}
    layers = sorted({int(m.group(1)) for _, n in local for m in [re.match(r"encoder\.layer\.(\d+)\.", n)] if m})
    out: Dict[str, torch.Tensor] = {}
    unknown: List[str] = []
    for (scope, name), tensor in local.items():
        per_layer = _HF_ROTARY_LAYER.fullmatch(name)
        if scope == "enc" and name == _HF_ROTARY_SHARED:
            out.update({f"layers.{i}.self_attn.rot_emb.inv_freq": tensor for i in layers})
        elif scope == "enc" and per_layer:
            out[f"layers.{per_layer.group(1)}.self_attn.rot_emb.inv_freq"] = tensor
        elif (scope, name) in backward:
            out[backward[(scope, name)]] = tensor
        else:
            unknown.append((enc_prefix if scope == "enc" else str(head_prefix)) + name)
    return KeyMapping(out, tuple(dropped), tuple(unknown))


def fair_name_to_hf(name: str, *, enc_prefix: str = "esm.", head_prefix: str = "lm_head.") -> Optional[str]:
    """The transformers name of a fair-esm ``ESM2`` module, or of anything under one (a quantized module's
    ``layers.0.fc1.weight_codes``, a wrapped LayerNorm's ``...module.weight``); None where there is none
    (the rotary tables: :func:`fair_esm2_to_hf` maps those, shared or per layer).

    Example: ``fair_name_to_hf("layers.3.self_attn.q_proj.input_quant.scale")`` is
    ``"esm.encoder.layer.3.attention.self.query.input_quant.scale"``.
    """
    for pattern, hf, scope in _name_rows():
        match = pattern.fullmatch(name)
        if match:
            index, rest = match.group("i"), match.group("rest") or ""
            return (enc_prefix if scope == "enc" else head_prefix) + hf.format(i=index) + rest
    return None


@functools.lru_cache(maxsize=1)
def _name_rows() -> Tuple[Tuple["re.Pattern[str]", str, str], ...]:
    """``_TABLE`` as (regex over fair-esm names, transformers format, scope): a ``.{p}`` row maps its module
    and everything under it, any other row its one tensor; whole layers map too (mixed-precision units)."""
    rows = []
    for fair, hf, scope in (*_TABLE, ("layers.{i}", "encoder.layer.{i}", "enc")):
        exact = not fair.endswith(".{p}")
        stem, hf_stem = (fair, hf) if exact else (fair[:-4], hf[:-4])
        regex = re.escape(stem).replace(re.escape("{i}"), r"(?P<i>\d+)")
        if "(?P<i>" not in regex:
            regex += "(?P<i>)"
        rows.append((re.compile(regex + ("(?P<rest>)" if exact else r"(?P<rest>\..+)?")), hf_stem, scope))
    return tuple(rows)


def uses_per_layer_rotary(model: torch.nn.Module) -> bool:
    """True for transformers 4.x layouts, which keep one rotary ``inv_freq`` per layer (5.x: one shared)."""
    return any(_HF_ROTARY_LAYER.search(k) for k in model.state_dict())


def _expand_table(names) -> List[Tuple[str, str, str]]:
    """Instantiate the table rows for the layer indices and weight/bias names present in ``names``."""
    indices = set()
    for name in names:
        match = re.match(r"(?:layers|encoder\.layer)\.(\d+)\.", name)
        if match:
            indices.add(match.group(1))
    rows = []
    for fair, hf, scope in _TABLE:
        for i in sorted(indices) if "{i}" in fair else [None]:
            for p in ("weight", "bias") if "{p}" in fair else [None]:
                rows.append((fair.format(i=i, p=p), hf.format(i=i, p=p), scope))
    return rows


def _put_same(out: Dict[str, torch.Tensor], key: str, tensor: torch.Tensor, source: str) -> None:
    """Store ``tensor`` under ``key`` once; several layers mapping to one key must agree."""
    if key in out and not torch.equal(out[key], tensor):
        raise ValueError(f"{source} differs from the rotary inv_freq of layer 0; the checkpoint is inconsistent")
    out.setdefault(key, tensor)
