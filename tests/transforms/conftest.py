"""Tiny seeded models shared by the transform tests (built once per session)."""

from tiny_fixtures import SEQS, esm2, esm2_plain, esmc, esmfold, hf_esm2, seqs  # noqa: F401 (fixtures)
