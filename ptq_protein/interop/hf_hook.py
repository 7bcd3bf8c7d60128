"""Register ptq-protein with transformers when, and only when, transformers loads its models.

``import ptq_protein`` must stay fast, and importing transformers' quantizer
registry costs seconds. So nothing is imported here: if
``transformers.modeling_utils`` is already loaded, the method is registered at
once; otherwise a one-shot import hook runs the registration right after that
module finishes executing (any ``from_pretrained`` or ``save_pretrained``
needs it, so it always runs first). The registration itself lives in
:mod:`ptq_protein.interop.hf_quantizer`; a failure there is a warning, never a
broken transformers import.

``from_pretrained`` reads ``config.json`` through ``AutoConfig`` before it imports
``modeling_utils``, so the config entry that refuses artifacts of ptq-protein's own
classes (ESM C, :mod:`ptq_protein.interop.hf_no_class`, light) is registered as soon as
:data:`CONFIG_TARGET` has executed.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings

__all__ = ["install", "TARGET", "CONFIG_TARGET"]

TARGET = "transformers.modeling_utils"
CONFIG_TARGET = "transformers.models.auto.configuration_auto"


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


def _register_config() -> None:
    try:
        from ptq_protein.interop.hf_no_class import register_no_class_config

        register_no_class_config()
    except Exception as err:  # never break the user's transformers import
        warnings.warn(f"ptq-protein could not register its config entry with transformers ({err}); "
                      "from_pretrained of an ESM C artifact will not say why it does not apply", stacklevel=2)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds its ``target`` module through the other finders and runs ``then`` once that module has executed.

    It leaves ``sys.meta_path`` only when the module really executed: a mere
    ``importlib.util.find_spec`` probe must not use up the hook.
    """

    searching = False

    def __init__(self, target: str = TARGET, then=_register):
        self.target, self.then = target, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.target or self.searching:
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
            self.then()

        spec.loader.exec_module = exec_then_register
        return spec


def install() -> None:
    """Register now if transformers' models are loaded, else when they are (called by ``ptq_protein/__init__``);
    the same for the config entry and ``configuration_auto``."""
    for target, then in ((CONFIG_TARGET, _register_config), (TARGET, _register)):
        if target in sys.modules:
            then()
        elif not any(isinstance(f, _AfterImport) and f.target == target for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(target, then))
