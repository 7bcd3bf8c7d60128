"""Tiny seeded models shared by the interop tests (built once per session)."""

from tiny_fixtures import SEQS, calib_seqs, esm2, esmfold, hf_esm2, seqs  # noqa: F401 (fixtures)
