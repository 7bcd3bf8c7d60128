"""Triton int8 kernels and their exact torch integer references (imported lazily)."""
