"""Units of the sensitivity analysis and the search: a site, a layer, or a model part.

A layer is the block a site sits in, read from the first ``<container>.<index>``
of its dotted name (``layers.3.fc1`` -> ``layers.3``; ESMFold ``esm.encoder.layer.1...``,
``trunk.blocks.0...``); sites outside any numbered block form their part's
``<part>.other`` unit. A part is the site group the model adapter assigns
(ESMFold: ``esm`` / ``trunk`` / ``structure``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ptq_protein.calibration.sites import Site

__all__ = ["UnitKind", "Unit", "make_units", "layer_of"]

_BLOCK = re.compile(r"^(?P<prefix>.*?\b(?:layers|layer|blocks|block)\.(?P<index>\d+))(?:\.|$)")


class UnitKind(str, enum.Enum):
    """How finely sites are grouped into units."""

    SITE = "site"
    LAYER = "layer"
    PART = "part"


@dataclass(frozen=True)
class Unit:
    """A group of sites quantized (or kept FP) together.

    ``kind`` is the site kind for site units (``linear`` / ``layernorm``), else the unit kind;
    ``layer`` the block index (-1 outside numbered blocks); ``part`` the adapter's group.
    """

    name: str
    kind: str
    layer: int
    part: str
    sites: Tuple[Site, ...]

    @property
    def site_names(self) -> Tuple[str, ...]:
        return tuple(s.name for s in self.sites)


def layer_of(name: str) -> Tuple[Optional[str], int]:
    """(block prefix, index) of a dotted module name, or (None, -1) outside numbered blocks."""
    match = _BLOCK.match(name)
    if match is None:
        return None, -1
    return match.group("prefix"), int(match.group("index"))


def make_units(sites: Sequence[Site], kind: UnitKind = UnitKind.SITE) -> List[Unit]:
    """Group ``sites`` (model order kept) into units of ``kind``."""
    kind = UnitKind(kind)
    if kind is UnitKind.SITE:
        return [Unit(s.name, s.kind.value, layer_of(s.name)[1], s.group, (s,)) for s in sites]
    groups: Dict[str, List[Site]] = {}
    meta: Dict[str, Tuple[int, str]] = {}
    for site in sites:
        if kind is UnitKind.PART:
            key, index = site.group, -1
        else:
            prefix, index = layer_of(site.name)
            key = prefix if prefix is not None else f"{site.group}.other"
        groups.setdefault(key, []).append(site)
        meta.setdefault(key, (index, site.group))
    return [Unit(key, kind.value, meta[key][0], meta[key][1], tuple(members)) for key, members in groups.items()]
