"""What ``ptq-protein embed`` computes and writes (torch-free: the CLI builds its parser from it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Tuple

__all__ = ["INCLUDE_CHOICES", "FORMATS", "EmbedOptions"]

#: What ``--include`` may name (fair-esm's four, and ``logits``).
INCLUDE_CHOICES = ("mean", "per_tok", "bos", "contacts", "logits")
FORMATS = ("pt", "h5")


@dataclass(frozen=True)
class EmbedOptions:
    """What to compute and how; everything here is recorded with the outputs (resumes must match it)."""

    repr_layers: Tuple[int, ...] = (-1,)
    include: Tuple[str, ...] = ("mean",)
    toks_per_batch: int = 4096
    truncation_seq_length: int = 1022
    format: str = "pt"
    version: int = 1

    def __post_init__(self) -> None:
        bad = [i for i in self.include if i not in INCLUDE_CHOICES]
        if bad or not self.include:
            raise ValueError(f"--include {' '.join(bad) or '(nothing)'}: choose from {', '.join(INCLUDE_CHOICES)}")
        if not self.repr_layers and set(self.include) & {"mean", "per_tok", "bos"}:
            raise ValueError("--repr-layers is empty but --include asks for representations; name layers, e.g. -1")
        for name in ("toks_per_batch", "truncation_seq_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} {value!r} must be a positive integer")
        if self.format not in FORMATS:
            raise ValueError(f"--format {self.format!r}: choose pt (fair-esm's LABEL.pt files) or h5 (HDF5)")
        object.__setattr__(self, "include", tuple(dict.fromkeys(self.include)))
        object.__setattr__(self, "repr_layers", tuple(int(i) for i in self.repr_layers))

    def to_dict(self) -> Dict[str, object]:
        return asdict(self)

    @property
    def wants_representations(self) -> bool:
        return bool(set(self.include) & {"mean", "per_tok", "bos"})
