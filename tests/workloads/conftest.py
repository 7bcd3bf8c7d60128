"""Tiny seeded models shared by the workload tests (built once per session)."""

from tiny_fixtures import SEQS, esm2, esmfold, hf_esm2, seqs  # noqa: F401 (fixtures)
