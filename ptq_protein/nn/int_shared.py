"""Integer linears that read one input (an attention layer's q, k and v) as one int8 GEMM on the CPU fast path.

q, k and v of a self-attention layer quantize the same tensor with equal
parameters (calibrated on the same values), so their activation codes are one
encoding, and their three GEMMs one GEMM against the weights stacked along N.
Per output column nothing changes: the same codes times the same weight column,
the same exact integer accumulator, the same float32 epilogue; only the
encoding, the split engine's bookkeeping and the BOS/EOS float rows run once
instead of three times, and oneDNN gets one wider GEMM.

A group is declared by the architecture code (``models/fused_float``: fair-esm
attention) as a plain attribute of each member, ``shared_input``: the tuple of
the group's linears in output order. It runs only while every member would take
the oneDNN path on this input with an equal quantizer, else each member runs
alone. The group holds the only prepacked copy of its members' weights (their
plain codes come back from it on demand), so the weights stay one int8 copy.

The members are still called one by one (hooks fire, each returns its slice):
the first call for an input computes every member's output and keeps it for the
others' calls with the same tensor (same object, unmodified: its version
counter; an inference-mode tensor has none, so there only the object is
compared), until each has taken its slice; a second call of a member
recomputes. A slice is a view of the group's ``[..., sum N]`` output (not
contiguous).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

import torch
from torch import nn

from ptq_protein.nn import cpu_int8
from ptq_protein.nn.cpu_int8_fused import float_rows
from ptq_protein.nn.int_exec import _fast_blocker, float_rows_linear, int_linear
from ptq_protein.nn.int_fast import fast_product
from ptq_protein.recipes.config import Backend, Engine

__all__ = ["int_forward", "shared_linear", "group_weights"]


class _Packed(NamedTuple):
    """The group's run-time state, kept in the first member's ``_int_cache`` (dropped on moves and loads)."""

    members: tuple
    packed: cpu_int8.Packed  # the stacked weight codes [sum N, K]
    bias: Optional[torch.Tensor]  # float32 [sum N], zeros for members without one
    bounds: List[int]  # member i owns output columns bounds[i]:bounds[i + 1]
    cache: dict  # the PWLQ plan; "memo": the last input's output


def int_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``QuantLinear.forward`` on backend int8: through the group's one GEMM (:func:`shared_linear`) when it runs
    here, else :func:`~ptq_protein.nn.int_exec.int_linear` with the BOS/EOS rows in float."""
    y = shared_linear(module, x)
    if y is None:
        y = module._float_rows(x, int_linear(module, x), lambda rows: float_rows_linear(module, rows))
    return y


def shared_linear(module: nn.Module, x: torch.Tensor) -> Optional[torch.Tensor]:
    """``module(x)`` on backend int8 through its group's one GEMM, or None when the group cannot run it
    (the caller then runs the module alone). x ``[..., K]`` -> ``[..., N]`` in x's dtype (a view)."""
    members = getattr(module, "shared_input", None)
    if not members or module not in members or not _runs_together(members, x):
        return None
    state = group_weights(members)
    i = members.index(module)
    memo = state.cache.get("memo")
    version = None if x.is_inference() else x._version  # inference tensors keep no version counter
    if memo is None or memo[0] is not x or memo[1] != version or i in memo[3]:
        memo = (x, version, _product(state, x), set())
        state.cache["memo"] = memo
    memo[3].add(i)
    if len(memo[3]) == len(members):
        state.cache.pop("memo")  # every member served: hold nothing between forwards
    module.engine_ran = Engine.ONEDNN.value
    return memo[2][..., state.bounds[i]:state.bounds[i + 1]]


def _runs_together(members: tuple, x: torch.Tensor) -> bool:
    """Every member would run the oneDNN path on ``x`` alone, with the same activation codes."""
    if x.device.type != "cpu":
        return False
    lead = members[0].input_quant
    for m in members:
        if (m.backend is not Backend.INT8 or m.input_quant is None or m.engine is Engine.REFERENCE
                or m.in_features != members[0].in_features or not _same_codes(m.input_quant, lead)
                or _fast_blocker(m, x) is not None):
            return False
    return True


def _same_codes(a: nn.Module, b: nn.Module) -> bool:
    """Two activation quantizers that give the same codes and the same kept rows for every input."""
    if a is b:
        return True
    if a.spec != b.spec or a.special_tokens is not b.special_tokens or a.channel_last != b.channel_last:
        return False
    if a.codebook is not None or b.codebook is not None:
        return a.codebook == b.codebook
    if hasattr(a, "scale") != hasattr(b, "scale"):
        return False
    return not hasattr(a, "scale") or (torch.equal(a.scale, b.scale) and torch.equal(a.zero_point, b.zero_point))


def group_weights(members: tuple) -> _Packed:
    """The group's prepacked weight, built (again) when a member's cache was reset."""
    state = members[0]._int_cache.get("shared")
    if state is not None and state.members == members and all(m._int_cache.get("shared") is state for m in members):
        return state
    codes = torch.cat([m.plain_weight_codes().to(torch.int8) for m in members])
    packed = cpu_int8.prepack(codes, torch.cat([m.weight_scale.reshape(-1) for m in members]))
    bias = None
    if any(m.bias is not None for m in members):
        bias = torch.cat([torch.zeros(m.out_features) if m.bias is None else m.bias.detach().to(torch.float32)
                          for m in members])
    bounds = [0]
    for m in members:
        bounds.append(bounds[-1] + m.out_features)
    state = _Packed(members, packed, bias, bounds, {})
    for m, lo, hi in zip(members, bounds, bounds[1:]):
        m._int_cache.pop("packed", None)  # its own copy, if it ran alone before: the group's is the one kept
        m._int_cache["shared"] = state
        m.release_weight_codes(lambda lo=lo, hi=hi: cpu_int8.unpack(packed)[lo:hi].contiguous())
    return state


def _product(state: _Packed, x: torch.Tensor) -> torch.Tensor:
    """Every member's output ``[..., sum N]`` in x's dtype, BOS/EOS rows in float (``QuantLinear._float_rows``)."""
    quant = state.members[0].input_quant
    x2 = x.reshape(-1, x.shape[-1])
    y = fast_product(quant, state.packed, state.bias, state.cache, x2)
    keep = quant.special_rows(x)
    if keep is not None:
        index = keep.expand(*x.shape[:-1], 1).reshape(-1).nonzero().flatten()
        rows = float_rows(x2.index_select(0, index), state.packed, state.bias)  # int8 planes, every member at once
        y.index_copy_(0, index, rows)
    return y.reshape(*x.shape[:-1], y.shape[-1]).to(x.dtype)
