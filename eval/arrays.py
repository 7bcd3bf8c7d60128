"""The backend-specific lines of the structure metrics; everything else is written once against the array API.

The TM-score search (:mod:`ptq_protein.eval.tmsearch`) and the superposition
(:mod:`ptq_protein.eval.superpose`) are one implementation written against the
Python array API standard: numpy itself from numpy 2.1 on (it implements
the standard), else through ``array-api-compat`` (as scipy and scikit-learn
do), which also serves torch. numpy arrays run them without importing torch, so
a single ``ptq-protein tmscore`` answers at about numpy's import cost; torch
tensors run them batched on CPU or CUDA. What the standard does not cover
(choosing a backend from user inputs, torch's autograd and thread settings, a
host copy) lives here, and only here is torch named.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, Optional, Sequence

import numpy as np
from array_api_compat import array_namespace, device, is_torch_array

__all__ = ["namespace", "device", "is_torch_array", "to_numpy", "on_accelerator", "compute_context", "pick_backend"]

# numpy >= 2.1 has every function the metrics use (cumulative_sum, astype, clip(min=)) in its main
# namespace; array-api-compat's numpy wrapper would add about 0.15 s of imports to a one-pair command.
_NATIVE_NUMPY = np.lib.NumpyVersion(np.__version__) >= "2.1.0"


def namespace(*arrays: Any) -> Any:
    """The array API namespace of numpy arrays or torch tensors (never imports torch)."""
    if _NATIVE_NUMPY and all(isinstance(a, np.ndarray) for a in arrays):
        return np
    return array_namespace(*arrays)


def to_numpy(a: Any) -> np.ndarray:
    """A host numpy array of ``a`` (numpy array, torch tensor on any device, or a sequence)."""
    if is_torch_array(a):
        a = a.detach().cpu()
    return np.asarray(a)


def on_accelerator(a: Any) -> bool:
    """True for an array on a GPU (or another non-CPU device)."""
    return getattr(device(a), "type", "cpu") != "cpu"


@contextlib.contextmanager
def compute_context(a: Any, cpu_threads: Optional[int]) -> Iterator[None]:
    """For torch: no autograd graph, and at most ``cpu_threads`` intra-op threads on CPU (restored after).

    Nothing for numpy. ``cpu_threads=None`` leaves torch's thread setting.
    """
    if not is_torch_array(a):
        yield
        return
    import torch  # already imported: ``a`` is a tensor

    before = torch.get_num_threads()
    if cpu_threads is not None and not on_accelerator(a) and 0 < cpu_threads < before:
        torch.set_num_threads(cpu_threads)
    try:
        with torch.no_grad():
            yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def pick_backend(arrays: Sequence[Any], device_arg: Any = None, dtype: Any = None) -> tuple:
    """(namespace, device, dtype) to compute on; float64 unless ``dtype`` says otherwise.

    torch when any of ``arrays`` is a tensor (on the first tensor's device), or
    when a torch device or dtype is asked for; otherwise numpy on the CPU,
    without importing torch.
    """
    tensors = [a for a in arrays if is_torch_array(a)]
    torch_dtype = "torch" in sys.modules and isinstance(dtype, sys.modules["torch"].dtype)
    if not tensors and device_arg is None and not torch_dtype:
        return namespace(np.zeros(0)), "cpu", np.dtype(np.float64 if dtype is None else dtype)
    import array_api_compat.torch as xp_torch
    import torch

    if device_arg is not None:
        where = torch.device(device_arg)
    else:
        where = tensors[0].device if tensors else torch.device("cpu")
    if dtype is None:
        dtype = torch.float64
    elif not isinstance(dtype, torch.dtype):
        dtype = getattr(torch, np.dtype(dtype).name)
    return xp_torch, where, dtype
