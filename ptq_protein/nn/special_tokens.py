"""Token-wise floating point for the language model's BOS/EOS rows (``SpecialTokens.FLOAT``).

ESM language models put their largest activations on the BOS (CLS) and EOS
positions: tens of times the residues' range on the planted outlier channels of
the tiny models, as in trained ESM-2. A range fitted to residues clips them, and a
range stretched to cover them coarsens every residue. As outlier-token work on
LLMs does (PrefixQuant, Chen et al. 2024, keeps such tokens out of the quantized
path; IntactKV keeps their keys/values in full precision), the positions are known
from the token ids, not detected from the values: a forward pre-hook on the LM's
token embedding records which positions of the current call are BOS/EOS, and
every activation quantizer of the model passes those rows (for an attention map
or pair tensor: every row and column of such a token) through unquantized. That
is two rows per sequence, whatever its length; padding rows are quantized like
residues (their values never reach a residue: attention masks them). A hook on
the whole model forgets the positions when its forward ends, so nothing else
(a report computing SQNR on a histogram, say) sees a stale mask.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional, Sequence

import torch
from torch import nn

from ptq_protein.calibration.masks import special_positions
from ptq_protein.calibration.matmul_sites import QuantMatmulHost
from ptq_protein.nn.modules import ActQuantizer
from ptq_protein.recipes.config import QuantConfig, SpecialTokens

__all__ = ["SpecialTokenContext", "keep_special_tokens_float_", "apply_special_tokens_"]

log = logging.getLogger(__name__)


class SpecialTokenContext:
    """Which positions of the running forward are BOS/EOS; read by the activation quantizers."""

    def __init__(self, special_ids: Sequence[int], padding_id: int):
        self.special_ids = tuple(int(i) for i in special_ids)
        self.padding_id = int(padding_id)
        self._computed: Optional[torch.Tensor] = None
        self._special: Optional[torch.Tensor] = None
        self._masks: Dict[tuple, Optional[torch.Tensor]] = {}

    def observe(self, module: nn.Module, args: tuple) -> None:
        """Forward pre-hook of the token embedding: ``args[0]`` are the token ids [B, T]."""
        ids = args[0] if args else None
        if not torch.is_tensor(ids) or ids.dim() != 2 or ids.is_floating_point():
            self.clear()
            return
        self._special = torch.isin(ids, torch.tensor(self.special_ids, device=ids.device))
        self._computed = ids != self.padding_id
        self._masks = {}

    def clear(self, *_: object) -> None:
        """Forget the positions (forward hook of the whole model, run even when it raises)."""
        self._computed = self._special = None
        self._masks = {}

    def rows(self, x: torch.Tensor, channel_last: bool = True) -> Optional[torch.Tensor]:
        """Bool mask broadcastable to ``x``: True at BOS/EOS positions; None when there are none."""
        if self._computed is None:
            return None
        key = (tuple(x.shape), channel_last, x.device)
        if key not in self._masks:
            found = special_positions(x.shape, self._computed, self._special, channel_last)
            self._masks[key] = None if found is None else found.to(x.device)
        return self._masks[key]


def keep_special_tokens_float_(model: nn.Module, adapter) -> Optional[SpecialTokenContext]:
    """Make every activation quantizer of ``model`` skip the LM's BOS/EOS rows (in place).

    ``adapter`` (:class:`~ptq_protein.models.adapters.ModelAdapter`) names the
    token embedding and the BOS/EOS/padding ids. Returns the shared context, or
    None (with a warning) when the model has no token embedding to read ids from.
    """
    tap = adapter.token_ids_tap(model)
    if tap is None:
        log.warning("%s: no token embedding to read BOS/EOS positions from; they are quantized like residues",
                    type(model).__name__)
        return None
    name, special_ids, padding_id = tap
    context = SpecialTokenContext(special_ids, padding_id)
    model.get_submodule(name).register_forward_pre_hook(context.observe)
    model.register_forward_hook(context.clear, always_call=True)
    for module in model.modules():
        if isinstance(module, QuantMatmulHost):
            for quant in module.quantizers.values():
                quant.channel_last = False  # operands: every dimension is positional (as in calibration)
        if isinstance(module, ActQuantizer):
            module.special_tokens = context
    return context


def apply_special_tokens_(model: nn.Module, adapter, config: QuantConfig) -> Optional[SpecialTokenContext]:
    """What ``config.special_tokens`` asks of a converted model: :func:`keep_special_tokens_float_` for ``float``."""
    if config.special_tokens is not SpecialTokens.FLOAT:
        return None
    # per-site activations (a mixed-precision plan) have no config-wide spec: look for quantizers
    if config.activations is None and not any(isinstance(m, ActQuantizer) for m in model.modules()):
        return None
    return keep_special_tokens_float_(model, adapter)
