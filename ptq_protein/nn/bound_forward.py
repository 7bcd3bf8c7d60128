"""Give one module instance a forward of its own (or its class's back), the way the execution passes swap them.

transformers' ESMFold classes are run as they are, with a few instances' ``forward`` replaced (the bf16 trunk's
autocast wrappers and fused triangle operations, the int8 pair trunk). Binding on the instance leaves the class,
and every other model built from it, untouched.
"""

from __future__ import annotations

import contextlib
import types
from typing import Callable, Iterator, Optional

from torch import nn

__all__ = ["bind_forward", "forward_as"]


def bind_forward(module: nn.Module, forward: Optional[Callable] = None) -> None:
    """Make ``forward(module, ...)`` the instance's forward; None: the class's own again."""
    module.__dict__.pop("forward", None)
    if forward is not None:
        module.forward = types.MethodType(forward, module)


@contextlib.contextmanager
def forward_as(module: nn.Module, forward: Callable) -> Iterator[nn.Module]:
    """While active, calling ``module(...)`` runs ``forward(module, ...)`` through the module's own call, so its
    hooks run too (a fold hands a block's mapped weights back in one); whatever forward it had is restored."""
    own = module.__dict__.get("forward")
    bind_forward(module, forward)
    try:
        yield module
    finally:
        module.__dict__.pop("forward", None)
        if own is not None:
            module.forward = own
