"""Tiny seeded models shared by the core tests (built once per session)."""

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

@pytest.fixture()
def calibration_counter(monkeypatch):
    """Counts calibration passes (calibrate() calls) and the model forwards run inside them.

    Wraps ``calibrate`` where the library calls it and every adapter class's
    ``forward``, so a forward counts only while a calibration pass is running.
    """
    from ptq_protein import api, shared_calibration
    from ptq_protein.models.adapters import ModelAdapter

    counts = {"passes": 0, "forwards": 0}
    inside = [False]
    real_calibrate = api.calibrate

    def counting_calibrate(*args, **kwargs):
        counts["passes"] += 1
        inside[0] = True
        try:
            return real_calibrate(*args, **kwargs)
        finally:
            inside[0] = False

    todo = [ModelAdapter]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "forward" in cls.__dict__:
            def counting_forward(self, *args, _real=cls.__dict__["forward"], **kwargs):
                counts["forwards"] += inside[0]
                return _real(self, *args, **kwargs)

            monkeypatch.setattr(cls, "forward", counting_forward)
    monkeypatch.setattr(shared_calibration, "calibrate", counting_calibrate)
    monkeypatch.setattr(api, "calibrate", counting_calibrate)
    return counts
