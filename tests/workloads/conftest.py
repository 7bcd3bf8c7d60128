"""Tiny seeded models shared by the workload tests (built once per session)."""

from pathlib import Path

import pytest
from tiny_fixtures import SEQS, esm2, esmc, esmfold, hf_esm2, seqs  # noqa: F401 (fixtures)


@pytest.fixture(scope="session")
def artifact(tmp_path_factory, esm2) -> Path:  # noqa: F811 (the fixture above)
    """A w8a8-uniform artifact of ``esm2``, calibrated on the shared sequences."""
    import ptq_protein as pp

    folder = tmp_path_factory.mktemp("art") / "w8a8"
    pp.save(pp.quantize(esm2, "w8a8-uniform", calibration=list(SEQS)), folder)
    return folder
