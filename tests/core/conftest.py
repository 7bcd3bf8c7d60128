"""Tiny seeded models shared by the core tests (built once per session)."""

import pytest
from tiny_fixtures import SEQS, calib_seqs, esm2, esm2_plain, esmc, esmfold, hf_esm2, seqs  # noqa: F401 (fixtures)


@pytest.fixture()
def calibration_counter(monkeypatch):
    """Counts calibration passes (calibrate() calls) and the model forwards run inside them.

    Wraps ``calibrate`` where the library calls it and every adapter class's
    ``forward``, so a forward counts only while a calibration pass is running.
    """
    from ptq_protein.models.adapters import ModelAdapter
    from ptq_protein.passes import forwards

    counts = {"passes": 0, "forwards": 0}
    inside = [False]
    real_calibrate = forwards.calibrate

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
    monkeypatch.setattr(forwards, "calibrate", counting_calibrate)  # every calibration pass runs through it
    return counts
