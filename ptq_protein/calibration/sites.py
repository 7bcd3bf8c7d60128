"""Quantization sites: discover them in a model and select them by kind, group and name glob.

A site is a module whose input (and, for Linear, weight) can be quantized:
every ``nn.Linear`` (transformers' ``EsmFoldLinear`` subclasses it), every
LayerNorm (torch's, transformers' ``EsmFoldLayerNorm``, fair-esm's
``ESM1bLayerNorm``), every ``nn.Softmax`` module (ESMFold's IPA softmax; the
other softmaxes are functional calls), and modules hosting attention / triangle
matmuls.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Dict, List

from torch import nn

from ptq_protein.models.adapters import ModelAdapter
from ptq_protein.recipes.config import QuantConfig, SiteKind

__all__ = ["Site", "discover_sites", "select_sites", "is_layernorm", "set_module", "MATMUL_HOSTS"]

_LAYERNORM_NAMES = {"LayerNorm", "EsmFoldLayerNorm", "ESM1bLayerNorm", "ESM1LayerNorm", "FusedLayerNorm"}

# Modules whose forward computes attention scores / probabilities (or triangle
# products) with torch.matmul / bmm / einsum: their operands are MATMUL sites.
MATMUL_HOSTS = {
    "MultiheadAttention",  # fair-esm
    "EsmSelfAttention",  # transformers ESM-2
    "EsmFoldSelfAttention",  # ESMFold sequence track
    "EsmFoldAttention",  # ESMFold triangle attention core
    "EsmFoldTriangleMultiplicativeUpdate",  # ESMFold pair track
    "EsmCAttention",  # ptq-protein's ESM C (its explicit path runs while a torch function mode is active)
}


def set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Replace the submodule at dotted ``name``."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def is_layernorm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or type(module).__name__ in _LAYERNORM_NAMES


@dataclass(frozen=True)
class Site:
    """One quantization site. ``name`` is the dotted module name."""

    name: str
    kind: SiteKind
    group: str
    module_type: str
    is_head: bool

    def to_dict(self) -> Dict[str, object]:
        return {"name": self.name, "kind": self.kind.value, "group": self.group,
                "module_type": self.module_type, "is_head": self.is_head}


def _kind_of(module: nn.Module):
    if isinstance(module, nn.Linear):
        return SiteKind.LINEAR
    if is_layernorm(module):
        return SiteKind.LAYERNORM
    if isinstance(module, nn.Softmax):
        return SiteKind.SOFTMAX
    if type(module).__name__ in MATMUL_HOSTS:
        return SiteKind.MATMUL
    return None


def discover_sites(model: nn.Module, adapter: ModelAdapter) -> List[Site]:
    """Every site of ``model`` in module order (heads included, flagged)."""
    sites = []
    for name, module in model.named_modules():
        kind = _kind_of(module)
        if kind is None or not name:
            continue
        sites.append(Site(name, kind, adapter.group_of(name), type(module).__name__, adapter.is_head(name)))
    return sites


def select_sites(sites: List[Site], config: QuantConfig) -> List[Site]:
    """The sites ``config`` quantizes: kind, group, heads rule, then include/exclude globs."""
    known_groups = {s.group for s in sites}
    if config.groups is not None:
        unknown = set(config.groups) - known_groups
        if unknown:
            raise ValueError(f"unknown site groups {sorted(unknown)}; this model has: {sorted(known_groups)}")
    chosen = []
    for site in sites:
        if site.kind not in config.kinds:
            continue
        if config.groups is not None and site.group not in config.groups:
            continue
        if site.is_head and not config.quantize_heads:
            continue
        if config.include and not any(fnmatch.fnmatchcase(site.name, g) for g in config.include):
            continue
        if any(fnmatch.fnmatchcase(site.name, g) for g in config.exclude):
            continue
        if site.kind is SiteKind.LAYERNORM and config.activations is None:
            continue  # a LayerNorm site only quantizes its input
        if site.kind in (SiteKind.MATMUL, SiteKind.SOFTMAX) and config.activations is None:
            continue
        chosen.append(site)
    return chosen
