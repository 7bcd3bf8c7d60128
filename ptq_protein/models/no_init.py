"""Build a model without initialising its weights: they are all loaded (or replaced) right after.

fair-esm's modules initialise through ``torch.nn.init``. Its functions become no-ops for the duration, as
transformers' ``no_init_weights`` makes them, without importing transformers (about 2 s of CPU). Built on the
meta device, the same skip keeps ``normal_`` and friends from importing PyTorch's compiler stack (their meta
implementations are decorated by it): another second at the start of every command.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

__all__ = ["skip_torch_init"]

_TORCH_INIT = ("uniform_", "normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
               "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "trunc_normal_", "orthogonal_", "sparse_")


@contextlib.contextmanager
def skip_torch_init() -> Iterator[None]:
    """``torch.nn.init``'s initialisers as no-ops inside the block (the parameters keep whatever memory holds)."""
    from torch.nn import init

    saved = {name: getattr(init, name) for name in _TORCH_INIT if hasattr(init, name)}
    try:
        for name in saved:
            setattr(init, name, lambda *args, **kwargs: None)
        yield
    finally:
        for name, fn in saved.items():
            setattr(init, name, fn)
