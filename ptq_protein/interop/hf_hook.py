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
    pending = sys.modules.get("ptq_protein.interop.hf_quantizer")
    if pending is not None and not hasattr(pending, "register"):
        return  # that module is being imported (it imported transformers): it registers when it ends
    try:
        from ptq_protein.interop.hf_quantizer import register

        register()
    except Exception as err:  # never break the user's transformers import
        warnings.warn(f"ptq-protein could not register its quantization method with transformers ({err}); "
                      "from_pretrained of ptq-protein artifacts will not work: use ptq_protein.load", stacklevel=2)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds :data:`TARGET` through the other finders and registers once its module has executed.

    It leaves ``sys.meta_path`` only when the module really executed: a mere
    ``importlib.util.find_spec`` probe must not use up the hook.
    """

    searching = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET or self.searching:
            return None
        self.searching = True  # the finders below must not find this one again
        try:
            spec = next((s for f in sys.meta_path if f is not self and hasattr(f, "find_spec")
                         for s in [f.find_spec(fullname, path, target)] if s is not None), None)
        finally:
            self.searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_then_register(module, _run=run):
            _run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _register()

        spec.loader.exec_module = exec_then_register
        return spec


def install() -> None:
    """Register now if transformers' models are loaded, else when they are (called by ``ptq_protein/__init__``)."""
    if TARGET in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
