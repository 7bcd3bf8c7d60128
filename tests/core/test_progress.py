"""Progress: log lines with an ETA when not at a terminal, a bar at one, nothing with --quiet."""

import logging

from ptq_protein.support import progress as progress_module
from ptq_protein.support.progress import progress


def test_log_lines_every_tenth_with_eta(caplog):
    with caplog.at_level(logging.INFO, logger="ptq_protein.support.progress"):
        assert list(progress(list(range(20)), "calibrating", "batches", terminal=False)) == list(range(20))
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "calibrating: 0/20 batches"
    assert len(lines) == 11 and lines[-1].startswith("calibrating: 20/20 batches (100%)")
    assert "left" in lines[1] and "left" not in lines[-1]


def test_slow_steps_log_at_least_every_interval(caplog, monkeypatch):
    clock = iter(range(0, 10_000, 40))  # every step takes 40 s, over LINE_EVERY_S
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="ptq_protein.support.progress"):
        list(progress(list(range(100)), "folding", "sequences", terminal=False))
    assert len(caplog.records) == 101  # every step is a line once steps are slower than the interval


def test_quiet_and_terminal(caplog):
    items = [1, 2, 3]
    assert progress(items, "x", "y", show=False) is items
    from tqdm.std import tqdm

    bar = progress(items, "x", "y", terminal=True)
    assert isinstance(bar, tqdm) and list(bar) == items


def test_smoothquant_and_gptq_passes_say_how_far_they_are(caplog, esm2, calib_seqs):
    """The model-changing passes of ESM-2's default (SmoothQuant's ranges, GPTQ's site groups) log progress as the
    calibration does: minutes of GPTQ on a large model are not silent."""
    import ptq_protein as pp

    with caplog.at_level(logging.INFO, logger="ptq_protein.support.progress"):
        pp.quantize(esm2, "w8a8-smoothquant-gptq", calibration=list(calib_seqs), progress=True)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("GPTQ: ") and "site groups" in line for line in lines)
    assert sum(line.startswith("calibrating: ") for line in lines) >= 2  # SmoothQuant's ranges, then the activations
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ptq_protein.support.progress"):
        pp.quantize(esm2, "w8a8-smoothquant-gptq", calibration=list(calib_seqs))
    assert not caplog.records  # progress=False: silent
