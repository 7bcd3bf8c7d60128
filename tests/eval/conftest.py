"""Fixtures for the structure evaluators: golden TMscore cases and a small all-atom native."""

from __future__ import annotations

import gzip
import json

import pytest
from eval_testlib import DATA, FULL_NATIVE


@pytest.fixture(scope="session")
def golden() -> dict:
    return json.loads((DATA / "golden_tmscore.json").read_text())


@pytest.fixture(scope="session")
def full_native_text() -> str:
    return gzip.decompress(FULL_NATIVE.read_bytes()).decode()


@pytest.fixture(scope="session")
def full_native():
    from ptq_protein.eval.structure import load_structure

    return load_structure(FULL_NATIVE)
