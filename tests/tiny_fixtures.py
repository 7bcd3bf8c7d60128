"""Tiny seeded models and sequences shared by several test folders (built once per session)."""

import pytest

SEQS = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDELKKLLAAGHRW", "ACDEFGHIKLMNPQRSTVWYACDEFGHIKL",
        "GSHMLEDPVAGVSKEELLKLAEEAR", "MSTNPKPQRKTKRNTNRRPQDVKFPGG"]


@pytest.fixture(scope="session")
def esm2():
    from ptq_protein.models.tiny import tiny_esm2

    return tiny_esm2(seed=0)[0]


@pytest.fixture(scope="session")
def esm2_plain():
    from ptq_protein.models.tiny import tiny_esm2

    return tiny_esm2(seed=1, outliers=None)[0]


@pytest.fixture(scope="session")
def hf_esm2():
    from ptq_protein.models.tiny import tiny_hf_esm2

    return tiny_hf_esm2(seed=0)[0]


@pytest.fixture(scope="session")
def esmc():
    from ptq_protein.models.tiny import tiny_esmc

    return tiny_esmc(seed=0)[0]


@pytest.fixture(scope="session")
def esmfold():
    from ptq_protein.models.tiny import tiny_esmfold

    return tiny_esmfold(seed=0)[0]


@pytest.fixture()
def seqs():
    return list(SEQS)


@pytest.fixture(scope="session")
def calib_seqs():
    """The same sequences for session/module-scoped fixtures (a tuple: nobody mutates it)."""
    return tuple(SEQS)
