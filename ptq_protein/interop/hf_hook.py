"""Register ptq-protein with transformers when, and only when, transformers loads its models.

``import ptq_protein`` must stay fast, and importing transformers' quantizer
registry costs seconds. So nothing is imported here: if
``transformers.modeling_utils`` is already loaded, the method is registered at
once; otherwise a one-shot import hook runs the registration right after that
module finishes executing (any ``from_pretrained`` or ``save_pretrained``
needs it, so it always runs first). The registration itself lives in
:mod:`ptq_protein.interop.hf_quantizer`; a failure there is a warning, never a
broken transformers import.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings

__all__ = ["install", "TARGET"]

TARGET = "transformers.modeling_utils"


def _register() -> None:
    try:
        from ptq_protein.interop.hf_quantizer import register

        register()
    except Exception as err:  # never break the user's transformers import
        warnings.warn(f"ptq-protein could not register its quantization method with transformers ({err}); "
                      "from_pretrained of ptq-protein artifacts will not work: use ptq_protein.load", stacklevel=2)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds :data:`TARGET` through the other finders and registers once its module has executed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the search below from finding this finder
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_then_register(module, _run=run):
                    _run(module)
                    _register()

                spec.loader.exec_module = exec_then_register
                return spec
        return None


def install() -> None:
    """Register now if transformers' models are loaded, else when they are (called by ``ptq_protein/__init__``)."""
    if TARGET in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
