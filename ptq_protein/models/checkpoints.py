"""Read PyTorch ``.pt`` checkpoints without running code from them.

fair-esm checkpoints are pickles. ESM-2/ESM-1b files hold tensors plus
``argparse.Namespace`` configs; ESMFold's ``esmfold_3B_v1.pt`` also holds an
omegaconf ``DictConfig`` (omegaconf is not even a dependency here). So:

1. ``torch.load(weights_only=True)`` with ``argparse.Namespace`` allowed for
   this one call (``torch.serialization.safe_globals``, not a global change).
   A Namespace is a plain attribute bag: building one runs no user code.
2. If the file needs other classes, it is read again with an *inert*
   unpickler: only torch's own weights-only allowlist (tensor rebuild
   functions, dtypes, OrderedDict, ...) plus Namespace resolve to real
   objects; every other class becomes a :class:`Unloaded` placeholder that
   only records its arguments, so no foreign code is imported or run. The
   tensors come back intact; the configs inside are inert trees that
   :func:`plain_config` reads as plain dicts (fair-esm ESMFold's omegaconf cfg).
3. ``allow_pickle=True`` (the user vouches for the file) does a full
   ``weights_only=False`` load instead of step 2.

Anything that still fails is reported as a corrupt file (:class:`InputError`).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import pickle
import types
import warnings
import zipfile
from pathlib import Path
from typing import Any, Dict, Mapping, Sequence, Tuple, Union

import torch

from ptq_protein.support.digests import file_sha256
from ptq_protein.support.errors import InputError

__all__ = ["Unloaded", "load_torch_checkpoint", "plain_config", "split_state", "file_sha256"]

logger = logging.getLogger(__name__)



class Unloaded:
    """Stand-in for a pickled object whose class was not allowed; holds only what the pickle passed.

    ``state`` is what ``BUILD`` passed (an object's ``__dict__``), ``entries`` and
    ``elements`` what ``SETITEMS`` / ``APPENDS`` passed (a dict or list subclass's
    contents). Every field is set in ``__new__``: protocol-2 pickles create objects
    with ``cls.__new__(cls)`` and never call ``__init__``.
    :func:`plain_config` turns a tree of these into plain dicts and lists.
    """

    qualified_name = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> "Unloaded":
        self = super().__new__(cls)
        self.args, self.kwargs, self.state, self.entries, self.elements = args, kwargs, None, {}, []
        return self

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __call__(self, *args: Any, **kwargs: Any) -> "Unloaded":
        # a pickled call whose callable was itself replaced (e.g. getattr(obj, "method")(...))
        return Unloaded(*args, **kwargs)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.entries[key] = value

    def append(self, value: Any) -> None:
        self.elements.append(value)

    def extend(self, values: Any) -> None:
        self.elements.extend(values)

    def __repr__(self) -> str:
        return f"<Unloaded {self.qualified_name}>"


def plain_config(obj: Any) -> Any:
    """A config read by :func:`load_torch_checkpoint` as plain dicts, lists and scalars (no code runs).

    Placeholders become what they held: a dict subclass its entries, a list
    subclass its elements, any other object its ``__dict__``; ``argparse.Namespace``
    its attributes. omegaconf's ``DictConfig``/``ListConfig`` pickle their items
    under ``_content`` and each value node its value under ``_val`` (omegaconf's
    ``__getstate__`` returns ``__dict__``): those are unwrapped, so fair-esm's
    ESMFold ``cfg`` reads as the nested dict it was written from. Back-references
    (omegaconf's ``_parent``) are cut.
    """
    return _plain(obj, set())


def _plain(obj: Any, seen: set) -> Any:
    if isinstance(obj, (str, bytes, int, float, bool, type(None), torch.Tensor)):
        return obj
    if id(obj) in seen:
        return None  # a cycle (a child's link to its parent)
    seen = seen | {id(obj)}
    if isinstance(obj, Unloaded):
        state = obj.state
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):  # (dict state, slots)
            state = {**(state[0] or {}), **state[1]}
        if isinstance(state, dict) and "_content" in state:  # omegaconf container
            return _plain(state["_content"], seen)
        if isinstance(state, dict) and "_val" in state:  # omegaconf value node
            return _plain(state["_val"], seen)
        if obj.elements:
            return [_plain(v, seen) for v in obj.elements]
        out = {k: _plain(v, seen) for k, v in obj.entries.items()}
        if isinstance(state, dict):
            out.update({k: _plain(v, seen) for k, v in state.items() if k != "_parent"})
        return out
    if isinstance(obj, argparse.Namespace):
        return _plain(vars(obj), seen)
    if isinstance(obj, Mapping):  # dict, OrderedDict, or a real DictConfig (allow_pickle=True)
        return {k: _plain(v, seen) for k, v in obj.items()}
    if isinstance(obj, Sequence):  # list, tuple, or a real ListConfig
        return [_plain(v, seen) for v in obj]
    return obj


def load_torch_checkpoint(path: Union[str, os.PathLike], *, allow_pickle: bool = False, mmap: bool = False,
                          quiet: bool = False) -> Any:
    """Load a ``.pt`` file onto the CPU as safely as its contents allow (see the module docstring).

    ``mmap=True`` maps the file instead of reading it (zip-format files, i.e.
    every file torch >= 1.6 writes): tensors are read from disk as they are
    touched, so a caller can hold a whole checkpoint while using a layer of it.
    ``quiet``: no note of inert placeholders (a peek before the load that says it).

    Raises
    ------
    InputError
        The file is missing, truncated, or not a PyTorch checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"checkpoint {path} does not exist; check the path")
    mmap = mmap and zipfile.is_zipfile(path)  # legacy (pre-1.6) files cannot be mapped: read them
    try:
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            # torch's note on a pickle protocol it does not write: the file is judged below, in one line
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        first_error = e
    except Exception as e:  # noqa: BLE001 -- zip, EOF and key errors all mean an unreadable file
        raise _corrupt(path, e) from e
    try:
        if allow_pickle:
            logger.warning("loading %s with full unpickling (allow_pickle=True): only do this for files you trust",
                           path)
            return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
        unpickler = _InertPickle()
        data = torch.load(path, map_location="cpu", weights_only=False, pickle_module=unpickler, mmap=mmap)
    except CraftedPickle as e:
        raise InputError(f"checkpoint {path} {e} (a crafted file: nothing was set or run); refused: use the "
                         "published file") from e
    except Exception as e:  # noqa: BLE001 -- any failure here means the file cannot be read safely
        if "magic number" in str(e) and not zipfile.is_zipfile(path):
            raise InputError(f"checkpoint {path} is a plain pickle, not a PyTorch file (torch.save writes a zip "
                             "archive); refused, nothing in it was run: save the weights with torch.save") from e
        raise _corrupt(path, e, first_error) from e
    if not quiet:
        logger.info("%s holds non-tensor objects %s; they were kept as inert placeholders, not executed",
                    path, sorted(unpickler.replaced))
    return data


# --- inert unpickling ------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _allowed_globals() -> Dict[str, Any]:
    """torch's weights-only allowlist (private API; a minimal list if it moves) plus argparse.Namespace."""
    try:
        from torch._weights_only_unpickler import _get_allowed_globals

        allowed = dict(_get_allowed_globals())
    except (ImportError, AttributeError):  # pragma: no cover - depends on the torch version
        allowed = {"collections.OrderedDict": __import__("collections").OrderedDict,
                   "torch._utils._rebuild_tensor_v2": torch._utils._rebuild_tensor_v2,
                   "torch._utils._rebuild_parameter": torch._utils._rebuild_parameter,
                   "torch.Size": torch.Size}
    allowed["argparse.Namespace"] = argparse.Namespace
    return allowed


@functools.lru_cache(maxsize=None)
def _placeholder(qualified_name: str) -> type:
    return type(qualified_name.rsplit(".", 1)[-1], (Unloaded,), {"qualified_name": qualified_name})


class CraftedPickle(InputError):
    """A pickle that tries to change a class, function or module while it loads (no honest checkpoint does)."""


def _refuse_build_on_globals(unpickler: "pickle._Unpickler") -> None:
    """Pickle's BUILD, on instances only: on a class (``torch.storage.UntypedStorage``), a function or a module
    it would set attributes process-wide, which torch's weights-only loader refuses too."""
    target = unpickler.stack[-2] if len(unpickler.stack) >= 2 else None
    if isinstance(target, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)):
        name = getattr(target, "__qualname__", getattr(target, "__name__", repr(target)))
        raise CraftedPickle(f"sets attributes of {getattr(target, '__module__', '')}.{name} while loading")
    pickle._Unpickler.load_build(unpickler)


class _InertPickle:
    """A ``pickle_module`` for ``torch.load`` whose Unpickler resolves only allowed globals and builds only
    instances (the pure-Python unpickler: its BUILD can be checked; checkpoints' pickles are small)."""

    def __init__(self) -> None:
        self.replaced = set()
        outer = self

        class Unpickler(pickle._Unpickler):
            dispatch = {**pickle._Unpickler.dispatch, pickle.BUILD[0]: _refuse_build_on_globals}

            def find_class(self, module: str, name: str) -> Any:
                qualified = f"{module}.{name}"
                allowed = _allowed_globals().get(qualified)
                if allowed is not None:
                    return allowed
                outer.replaced.add(qualified)
                return _placeholder(qualified)

        self.Unpickler = Unpickler
        # torch's legacy (non-zip) reader calls pickle_module.load: keep it inert too.
        self.load = lambda handle, **kwargs: Unpickler(handle, **kwargs).load()
        self.__name__ = "ptq_protein_inert_pickle"


def _corrupt(path: Path, error: BaseException, first: BaseException = None) -> InputError:
    detail = _first_sentence(error)
    if first is not None:
        detail += f" (weights-only load: {_first_sentence(first)})"
    return InputError(f"checkpoint {path} could not be read as a PyTorch file: {detail}; "
                      "it may be truncated or corrupt: re-download it")


def _first_sentence(error: BaseException, limit: int = 160) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"{type(error).__name__}: {text.split('. ')[0][:limit]}"


def split_state(data: Any, path: Path) -> Tuple[Dict[str, torch.Tensor], Any]:
    """(state dict, rest) of a fair-esm style ``{"model": state_dict, ...}`` checkpoint."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise InputError(f"checkpoint {path} is not a fair-esm checkpoint (no 'model' state dict); "
                         "pass a fair-esm .pt file, or a Hugging Face folder")
    return data["model"], {k: v for k, v in data.items() if k != "model"}
