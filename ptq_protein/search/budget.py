"""The budget of the automatic search: a metric bound (``tm>=0.99``), an average width, or both."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Dict, Optional

from ptq_protein.recipes.site_plan import FP_BITS
from ptq_protein.search.metrics import METRIC_VALUES, Metric
from ptq_protein.support.errors import InputError

__all__ = ["Budget", "VALUE_METRIC"]

#: value name -> (metric that measures it, True where higher is better)
VALUE_METRIC: Dict[str, tuple] = {name: (metric, higher) for metric, values in METRIC_VALUES.items()
                                  for name, higher in values.items()}
_EXPR = re.compile(r"^\s*(?P<name>[a-z_0-9]+)\s*(?P<op>>=|<=)\s*(?P<value>[-+0-9.eE]+)\s*$")
_FORMS = "tm>=X, contacts>=X, top1>=X or logits_rel<=X"


@dataclass(frozen=True)
class Budget:
    """``value_name op threshold`` on the held-out metric and/or ``max_bits_avg``
    (see :mod:`ptq_protein.recipes.site_plan`)."""

    value_name: Optional[str] = None
    threshold: Optional[float] = None
    max_bits_avg: Optional[float] = None

    def __post_init__(self) -> None:
        if self.value_name is None and self.max_bits_avg is None:
            raise InputError(f"give a budget: a metric bound ({_FORMS}) and/or a maximum average bit width")
        if self.value_name is not None:
            if self.value_name not in VALUE_METRIC:
                raise InputError(f"budget metric {self.value_name!r} is unknown; write {_FORMS}")
            if self.threshold is None or not math.isfinite(self.threshold):
                raise InputError(f"budget {self.value_name} needs a finite threshold")
            higher = VALUE_METRIC[self.value_name][1]
            if higher and not 0.0 <= self.threshold <= 1.0:
                raise InputError(f"budget {self.text} can never hold: {self.value_name} lies in [0, 1]")
            if not higher and self.threshold < 0:
                raise InputError(f"budget {self.text} can never hold: {self.value_name} is never negative")
        if self.max_bits_avg is not None and not 2.0 <= self.max_bits_avg <= FP_BITS:
            raise InputError(f"--max-bits-avg {self.max_bits_avg} must be between 2 and {FP_BITS} (FP counts "
                             f"as {FP_BITS})")

    @classmethod
    def parse(cls, text: Optional[str] = None, max_bits_avg: Optional[float] = None) -> "Budget":
        """``Budget.parse("tm>=0.99")``, ``Budget.parse(max_bits_avg=6)``."""
        if text is None:
            return cls(max_bits_avg=max_bits_avg)
        match = _EXPR.match(str(text).lower())
        if match is None:
            raise InputError(f"budget {text!r} is not understood; write {_FORMS} (e.g. --budget 'tm>=0.99')")
        name, op = match.group("name"), match.group("op")
        try:
            value = float(match.group("value"))
        except ValueError as err:
            raise InputError(f"budget {text!r}: {match.group('value')!r} is not a number") from err
        if name in VALUE_METRIC and (op == ">=") != VALUE_METRIC[name][1]:
            right = ">=" if VALUE_METRIC[name][1] else "<="
            raise InputError(f"budget {text!r}: {name} is {'higher' if right == '>=' else 'lower'} when better, "
                             f"so write {name}{right}X")
        return cls(name, value, max_bits_avg)

    @property
    def metric(self) -> Optional[Metric]:
        return None if self.value_name is None else VALUE_METRIC[self.value_name][0]

    @property
    def text(self) -> str:
        parts = []
        if self.value_name is not None:
            parts.append(f"{self.value_name}{'>=' if VALUE_METRIC[self.value_name][1] else '<='}{self.threshold:g}")
        if self.max_bits_avg is not None:
            parts.append(f"avg_bits<={self.max_bits_avg:g}")
        return " and ".join(parts)

    def loss_of(self, values: Dict[str, float]) -> float:
        """The bounded value as a loss (0 = FP, larger is worse)."""
        value = values[self.value_name]
        return 1.0 - value if VALUE_METRIC[self.value_name][1] else value

    @property
    def loss_limit(self) -> float:
        """The largest allowed :meth:`loss_of` (+inf without a metric bound)."""
        if self.value_name is None:
            return math.inf
        return 1.0 - self.threshold if VALUE_METRIC[self.value_name][1] else self.threshold

    def metric_holds(self, values: Dict[str, float]) -> bool:
        return self.value_name is None or self.loss_of(values) <= self.loss_limit + 1e-12
