"""Old import paths (before the stage folders) as deprecated aliases of the new modules.

``ptq_protein.artifact`` itself is now the artifact's folder; its functions are in ``ptq_protein.artifact.save_load``
(and ``pp.save`` / ``pp.load``, unchanged).

``import ptq_protein.modules`` still works in old notebooks: it warns once with a
``DeprecationWarning`` naming the new path and hands back the very same module
object, so state (and ``isinstance`` checks) are shared. To be removed in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["MOVED", "install"]

MOVED = {
    "ptq_protein.adapters": "ptq_protein.models.adapters",
    "ptq_protein.budget": "ptq_protein.workflows.memory_budget",
    "ptq_protein.recipe_compare": "ptq_protein.workflows.recipe_compare",
    "ptq_protein.shared_calibration": "ptq_protein.workflows.shared_calibration",
    "ptq_protein.streaming": "ptq_protein.workflows.streaming",
    "ptq_protein.architecture": "ptq_protein.models.architecture",
    "ptq_protein.calibrate": "ptq_protein.calibration.calibrate",
    "ptq_protein.convert": "ptq_protein.nn.convert",
    "ptq_protein.eval_contacts": "ptq_protein.eval.bench.contacts_task",
    "ptq_protein.eval_runner": "ptq_protein.eval.bench.runner",
    "ptq_protein.eval_structure": "ptq_protein.eval.bench.structure_task",
    "ptq_protein.eval_summary": "ptq_protein.eval.bench.summary",
    "ptq_protein.fidelity": "ptq_protein.eval.bench.fidelity",
    "ptq_protein.folding": "ptq_protein.eval.bench.folding",
    "ptq_protein.fused": "ptq_protein.nn.fused",
    "ptq_protein.int_exec": "ptq_protein.nn.int_exec",
    "ptq_protein.masks": "ptq_protein.calibration.masks",
    "ptq_protein.matmul_sites": "ptq_protein.calibration.matmul_sites",
    "ptq_protein.modules": "ptq_protein.nn.modules",
    "ptq_protein.qparams": "ptq_protein.nn.qparams",
    "ptq_protein.results_store": "ptq_protein.eval.bench.results_store",
    "ptq_protein.sets": "ptq_protein.data.sets",
    "ptq_protein.sites": "ptq_protein.calibration.sites",
    "ptq_protein.artifact_build": "ptq_protein.artifact.build",
    "ptq_protein.artifact_fair_hf": "ptq_protein.artifact.fair_hf",
    "ptq_protein.artifact_hf": "ptq_protein.artifact.hf_files",
    "ptq_protein.artifact_seal": "ptq_protein.artifact.seal",
    "ptq_protein.artifact_tensors": "ptq_protein.artifact.tensors",
    "ptq_protein.config": "ptq_protein.recipes.config",
    "ptq_protein.digests": "ptq_protein.support.digests",
    "ptq_protein.env_settings": "ptq_protein.support.env_settings",
    "ptq_protein.errors": "ptq_protein.support.errors",
    "ptq_protein.fasta": "ptq_protein.data.fasta",
    "ptq_protein.file_reads": "ptq_protein.support.file_reads",
    "ptq_protein.io_utils": "ptq_protein.support.io_utils",
    "ptq_protein.method_config": "ptq_protein.recipes.method_config",
    "ptq_protein.model_card": "ptq_protein.artifact.model_card",
    "ptq_protein.plots": "ptq_protein.support.plots",
    "ptq_protein.presets": "ptq_protein.recipes.presets",
    "ptq_protein.process_memory": "ptq_protein.support.process_memory",
    "ptq_protein.progress": "ptq_protein.support.progress",
    "ptq_protein.report": "ptq_protein.passes.site_report",
    "ptq_protein.run_manifest": "ptq_protein.workloads.run_manifest",
    "ptq_protein.site_plan": "ptq_protein.recipes.site_plan",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new
        self.spec = None

    def create_module(self, spec):
        # stacklevel 2: warnings skips importlib's frames, so this names the importing line; Python's default
        # filters show a DeprecationWarning only there in __main__ (a script, a notebook): 3 named no frame
        warnings.warn(f"{spec.name} moved to {self.new}; the old path will be removed in ptq-protein 0.3",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        """The target module is already executed; give it back its own ``__spec__``, which the import system
        has just replaced with the alias's (``importlib.reload`` and pickling read it)."""
        module.__spec__ = self.spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    """Register the alias finder once (called by ``ptq_protein/__init__``)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
