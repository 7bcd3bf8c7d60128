"""Tiny seeded models shared by the passes tests (built once per session)."""

from tiny_fixtures import esm2, esmfold, hf_esm2, seqs  # noqa: F401 (fixtures)
