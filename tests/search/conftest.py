"""Short real sequences (cropped) shared by the search tests."""

import pytest

from ptq_protein.data.sets import load_set

CROP = 96


@pytest.fixture(scope="session")
def metric_seqs():
    return [s[:CROP] for s in load_set("cameo139:3").sequences()]


@pytest.fixture(scope="session")
def calib_seqs():
    return [s[:CROP] for s in load_set("casp14:6").sequences()]


@pytest.fixture(scope="session")
def esm2():
    from ptq_protein.models.tiny import tiny_esm2

    return tiny_esm2(seed=0)[0]
