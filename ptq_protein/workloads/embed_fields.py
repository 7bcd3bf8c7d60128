"""What ``embed`` can write per sequence (torch-free: the CLI's parser offers these before any model loads)."""

from __future__ import annotations

__all__ = ["INCLUDE_CHOICES"]

INCLUDE_CHOICES = ("mean", "per_tok", "bos", "contacts", "logits")  # fair-esm extract.py's --include, plus logits
