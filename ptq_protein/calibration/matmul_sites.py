"""MATMUL sites: the operands of attention score / probability matmuls and triangle einsums.

These products are ``torch.matmul`` / ``bmm`` / ``einsum`` calls inside a host
module's forward (fair-esm ``MultiheadAttention``, ESMFold's attention and
triangle multiplicative update), not module calls, so no hook can see them. A
:class:`~torch.overrides.TorchFunctionMode` active only while the host runs
intercepts them instead. Operand ``j`` of the ``i``-th product of a host forward
is the sub-site ``"<host>@<i>.<j>"``; the same numbering drives calibration
(statistics per sub-site) and execution (a quantizer per sub-site). Products
with a 1-D operand (e.g. rotary frequency tables) are not sites.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["MatmulInterceptor", "QuantMatmulHost", "subsite_name", "MATMUL_FUNCTIONS"]

log = logging.getLogger(__name__)

MATMUL_FUNCTIONS = {torch.matmul, torch.bmm, torch.einsum, torch.Tensor.matmul, torch.Tensor.bmm,
                    torch.Tensor.__matmul__}


def subsite_name(host: str, call: int, operand: int) -> str:
    return f"{host}@{call}.{operand}"


def _operands(func, args):
    """(positions of tensor operands in args, or None if this call is not a site)."""
    if func is torch.einsum:
        tensors = args[1:] if len(args) > 2 or not isinstance(args[1], (list, tuple)) else args[1]
        if not all(torch.is_tensor(t) and t.dim() >= 2 for t in tensors):
            return None
        return "einsum"
    if len(args) >= 2 and all(torch.is_tensor(a) and a.dim() >= 2 for a in args[:2]):
        return "binary"
    return None


class MatmulInterceptor(TorchFunctionMode):
    """Applies ``transform(call, operand, tensor) -> tensor`` to every product's operands."""

    def __init__(self, transform: Callable[[int, int, torch.Tensor], torch.Tensor]):
        super().__init__()
        self.transform = transform
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in MATMUL_FUNCTIONS:
            return func(*args, **kwargs)
        kind = _operands(func, args)
        if kind is None:
            return func(*args, **kwargs)
        call = self.calls
        self.calls += 1
        if kind == "binary":
            new = [self.transform(call, j, a) for j, a in enumerate(args[:2])]
            return func(*new, *args[2:], **kwargs)
        equation, rest = args[0], args[1:]
        packed = len(rest) == 1 and isinstance(rest[0], (list, tuple))
        tensors = rest[0] if packed else rest
        new = [self.transform(call, j, t) for j, t in enumerate(tensors)]
        return func(equation, new, **kwargs) if packed else func(equation, *new, **kwargs)


class QuantMatmulHost(nn.Module):
    """Runs ``module`` with its matmul operands fake-quantized by per-sub-site quantizers."""

    def __init__(self, module: nn.Module, name: str, quantizers: Dict[str, nn.Module]):
        super().__init__()
        self.module = module
        self.site_name = name
        # ModuleDict keys may not contain '.', so store by "<call>_<operand>".
        self.quantizers = nn.ModuleDict({k.rsplit("@", 1)[1].replace(".", "_"): q for k, q in quantizers.items()})
        self._warned = False

    def _transform(self, call: int, operand: int, x: torch.Tensor) -> torch.Tensor:
        key = f"{call}_{operand}"
        quant: Optional[nn.Module] = self.quantizers[key] if key in self.quantizers else None
        if quant is None or not x.is_floating_point():
            if quant is None and not self._warned:
                log.warning("%s: matmul %d operand %d was not seen during calibration; it runs in floating point",
                            self.site_name, call, operand)
                self._warned = True
            return x
        return quant(x)

    def forward(self, *args, **kwargs):
        with MatmulInterceptor(self._transform):
            return self.module(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("module"), name)

