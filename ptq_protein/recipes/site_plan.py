"""Per-unit precision choices and the mixed-precision plan recorded in an artifact.

A :class:`UnitChoice` is one row of the menu the automatic search picks from:
weights in floating point or uniform per-channel at 8/6/4 bits, and activations
in floating point or static per-tensor at 8/6 bits, piecewise-linear (PWLQ) or
uniform. A :class:`MixedPlan` maps each unit (a group of sites) to one choice; it
is small, validated and versioned so ``recipe.json`` can record and reload it.

Average bit width (the ``--max-bits-avg`` measure): the mean of the parameter-
weighted weight width over the Linear sites in scope and the plain mean
activation width over the activation sites in scope, floating point counted as
:data:`FP_BITS`. So ``w8a8`` is 8, ``w4a8`` and ``w6a6`` are 6 and FP is 16.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from ptq_protein.recipes.config import Granularity, RangeMethod, Scheme, TensorQuant

__all__ = ["FP_BITS", "PLAN_VERSION", "UnitChoice", "MixedPlan", "DEFAULT_CHOICES", "ALL_CHOICES", "parse_choices"]

FP_BITS = 16  # floating point counts as 16 bits (fp16/bf16 storage), the usual mixed-precision baseline
PLAN_VERSION = 1
_WEIGHT_BITS = (8, 6, 4)
_ACT_BITS = (8, 6)
_NAME = re.compile(r"^(?:w(?P<w>\d+))?(?:a(?P<a>\d+)-(?P<s>pwlq|uniform))?$")


@dataclass(frozen=True)
class UnitChoice:
    """Precision of one unit: ``weight_bits`` (None = FP), ``act_bits`` and ``act_scheme`` (None = FP).

    The tensor specs are those of the presets: uniform symmetric per-channel
    weights; PWLQ activations asymmetric with MSE breakpoints over the min-max
    range, uniform activations symmetric with the top-k median range.
    """

    weight_bits: Optional[int] = None
    act_bits: Optional[int] = None
    act_scheme: Optional[Scheme] = None

    def __post_init__(self) -> None:
        if self.act_scheme is not None:
            object.__setattr__(self, "act_scheme", Scheme(self.act_scheme))
        if self.weight_bits is not None and self.weight_bits not in _WEIGHT_BITS:
            raise ValueError(f"weight width {self.weight_bits} is not offered; choose one of {_WEIGHT_BITS} or FP")
        if (self.act_bits is None) != (self.act_scheme is None):
            raise ValueError("activation width and scheme go together: give both (e.g. a8-pwlq) or neither")
        if self.act_bits is not None and self.act_bits not in _ACT_BITS:
            raise ValueError(f"activation width {self.act_bits} is not offered; choose one of {_ACT_BITS} or FP")

    @property
    def name(self) -> str:
        """``fp``, ``w8``, ``a8-pwlq``, ``w4a8-uniform``, ..."""
        w = "" if self.weight_bits is None else f"w{self.weight_bits}"
        a = "" if self.act_bits is None else f"a{self.act_bits}-{self.act_scheme.value}"
        return (w + a) or "fp"

    @classmethod
    def parse(cls, name: str) -> "UnitChoice":
        match = _NAME.match(name.strip().lower())
        if name.strip().lower() == "fp":
            return cls()
        if not match or not name.strip():
            raise ValueError(f"precision choice {name!r} is not fp, wN, aN-SCHEME or wNaN-SCHEME (e.g. w6a8-pwlq)")
        w, a, s = match.group("w"), match.group("a"), match.group("s")
        return cls(None if w is None else int(w), None if a is None else int(a), s)

    @property
    def is_fp(self) -> bool:
        return self.weight_bits is None and self.act_bits is None

    @property
    def integer(self) -> bool:
        """Whether backend='int8' runs this choice's Linear sites as integer GEMMs (weights and inputs quantized)."""
        return self.weight_bits is not None and self.act_bits is not None

    def weight_spec(self) -> Optional[TensorQuant]:
        if self.weight_bits is None:
            return None
        return TensorQuant(bits=self.weight_bits, granularity=Granularity.PER_CHANNEL, symmetric=True)

    def act_spec(self) -> Optional[TensorQuant]:
        if self.act_bits is None:
            return None
        if self.act_scheme is Scheme.PWLQ:
            return TensorQuant(bits=self.act_bits, scheme=Scheme.PWLQ, symmetric=False,
                               range_method=RangeMethod.MINMAX)
        return TensorQuant(bits=self.act_bits, scheme=Scheme.UNIFORM, symmetric=True, range_method=RangeMethod.TOPK)

    def bits(self) -> Tuple[int, int]:
        """(weight bits, activation bits), FP as :data:`FP_BITS`."""
        return (self.weight_bits or FP_BITS, self.act_bits or FP_BITS)


def _product() -> Tuple[UnitChoice, ...]:
    acts = [(None, None)] + [(b, s) for b in _ACT_BITS for s in (Scheme.PWLQ, Scheme.UNIFORM)]
    return tuple(UnitChoice(w, a, s) for w in (None,) + _WEIGHT_BITS for a, s in acts)


#: Every offered choice (4 weight widths x 5 activation options).
ALL_CHOICES: Tuple[UnitChoice, ...] = _product()
#: The search's default menu: PWLQ activations at 8/6 bits with 8/6/4-bit weights, uniform A8, and FP.
DEFAULT_CHOICES: Tuple[UnitChoice, ...] = tuple(UnitChoice.parse(n) for n in (
    "fp", "w8a8-pwlq", "w6a8-pwlq", "w4a8-pwlq", "w8a6-pwlq", "w6a6-pwlq", "w4a6-pwlq", "w8a8-uniform"))


def parse_choices(text: Optional[str]) -> Tuple[UnitChoice, ...]:
    """``None`` -> the default menu; ``"all"`` -> every choice; else a comma list (FP is always added)."""
    if text is None:
        return DEFAULT_CHOICES
    if text.strip().lower() == "all":
        return ALL_CHOICES
    choices = [UnitChoice.parse(part) for part in text.split(",") if part.strip()]
    if not choices:
        raise ValueError(f"choices {text!r} is empty; give a comma list such as w8a8-pwlq,w4a8-pwlq")
    return tuple(dict.fromkeys([UnitChoice(), *choices]))


@dataclass(frozen=True)
class MixedPlan:
    """Unit -> choice, the sites of each unit, the budget it was searched for, and the measured outcome."""

    units: Tuple[Tuple[str, str, Tuple[str, ...]], ...]  # (unit name, choice name, site names)
    budget: str = ""
    avg_bits: float = float(FP_BITS)
    verified: Tuple[Tuple[str, float], ...] = ()  # metric name -> value on the held-out sequences
    version: int = PLAN_VERSION

    def __post_init__(self) -> None:
        if self.version != PLAN_VERSION:
            raise ValueError(f"mixed-precision plan version {self.version} is not supported (this is {PLAN_VERSION}); "
                             "re-run quantize --auto")
        seen: Dict[str, str] = {}
        units = []
        for unit, choice, sites in self.units:
            UnitChoice.parse(choice)
            for site in sites:
                if site in seen:
                    raise ValueError(f"site {site!r} is in two units ({seen[site]!r} and {unit!r}) of the plan")
                seen[site] = unit
            units.append((str(unit), str(choice), tuple(sites)))
        object.__setattr__(self, "units", tuple(units))
        object.__setattr__(self, "verified", tuple((str(k), float(v)) for k, v in self.verified))

    def site_choices(self) -> Dict[str, UnitChoice]:
        return {site: UnitChoice.parse(choice) for _, choice, sites in self.units for site in sites}

    def to_dict(self) -> Dict[str, Any]:
        return {"version": self.version, "budget": self.budget, "avg_bits": self.avg_bits,
                "verified": dict(self.verified),
                "units": [{"unit": u, "choice": c, "sites": list(s)} for u, c, s in self.units]}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "MixedPlan":
        unknown = set(data) - {"version", "budget", "avg_bits", "verified", "units"}
        if unknown:
            raise ValueError(f"unknown mixed-precision plan fields {sorted(unknown)}")
        try:
            units = tuple((u["unit"], u["choice"], tuple(u["sites"])) for u in data["units"])
        except (KeyError, TypeError) as err:
            raise ValueError(f"mixed-precision plan units must be {{unit, choice, sites}} records ({err})") from err
        return cls(units, data.get("budget", ""), float(data.get("avg_bits", FP_BITS)),
                   tuple(dict(data.get("verified", {})).items()), data.get("version", PLAN_VERSION))


def average_bits(choices: Dict[str, UnitChoice], weight_numel: Dict[str, int], act_sites: Sequence[str]) -> float:
    """The plan's average width (module docstring); sites absent from ``choices`` count as FP."""
    fp = UnitChoice()
    total = sum(weight_numel.values())
    w = sum(n * choices.get(s, fp).bits()[0] for s, n in weight_numel.items()) / total if total else FP_BITS
    a = sum(choices.get(s, fp).bits()[1] for s in act_sites) / len(act_sites) if act_sites else FP_BITS
    return 0.5 * (w + a)
