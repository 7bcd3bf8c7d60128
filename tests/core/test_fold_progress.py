"""Progress inside one fold: lines while a long fold runs (per trunk block, rate-limited), none for a fast one."""

import copy
import logging
import re

import pytest

from ptq_protein.eval.bench.fold_progress import fold_progress, trunk_passes
from ptq_protein.eval.bench.folding import fold_output
from ptq_protein.support.progress import Ticker

LOGGER = "ptq_protein.support.progress"
SEQ = "MKTAYIAKQRQISFVKSHFSRQ"


class Clock:
    """A clock that moves ``step`` seconds each time it is read: no real time involved."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_the_ticker_waits_an_interval_between_lines(caplog):
    ticker = Ticker("folding a", 4, "trunk blocks", interval=1.5, clock=Clock(1.0))  # 1 s a block
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for done in range(1, 5):
            ticker(done, "pass 1/1")
    assert _lines(caplog) == ["folding a: 2/4 trunk blocks (pass 1/1), 2 s elapsed, about 2 s left",
                              "folding a: 4/4 trunk blocks (pass 1/1), 4 s elapsed"]
    with pytest.raises(ValueError, match="total=0"):
        Ticker("x", 0, "y")


@pytest.mark.parametrize("pair_bits", [None, 8])
def test_a_slow_fold_logs_every_block_and_a_fast_one_nothing(esmfold, caplog, pair_bits):
    model = esmfold
    if pair_bits:
        from ptq_protein.nn.pair_int8 import use_pair_int8

        model = use_pair_int8(copy.deepcopy(esmfold), pair_bits)
    blocks, passes = len(model.trunk.blocks), trunk_passes(model.trunk, 1)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        with fold_progress(model, "folding a", num_recycles=1, interval=0.5, clock=Clock(1.0)):
            fold_output(model, SEQ, num_recycles=1, max_memory=1 << 40)
    lines = _lines(caplog)
    assert len(lines) == passes * blocks == 2 * blocks  # one recycle: two passes
    assert re.fullmatch(rf"folding a: {2 * blocks}/{2 * blocks} trunk blocks \(pass 2/2\), \d+ s elapsed", lines[-1])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        with fold_progress(model, "folding a", num_recycles=1, interval=1e9, clock=Clock(1.0)):
            fold_output(model, SEQ, num_recycles=1, max_memory=1 << 40)
    assert _lines(caplog) == []
    assert not model.trunk.blocks[0].mlp_seq._forward_hooks  # the hooks are gone


def test_fold_output_labels_its_lines_and_is_silent_without_a_label(esmfold, caplog, monkeypatch):
    from ptq_protein.eval.bench import fold_progress as module

    monkeypatch.setattr(module, "LINE_EVERY_S", 0.0)  # every block a line
    with caplog.at_level(logging.INFO, logger=LOGGER):
        fold_output(esmfold, SEQ, num_recycles=0, max_memory=1 << 40, progress="folding a (22 residues)")
        assert _lines(caplog) and all(line.startswith("folding a (22 residues): ") for line in _lines(caplog))
        caplog.clear()
        fold_output(esmfold, SEQ, num_recycles=0, max_memory=1 << 40)
    assert _lines(caplog) == []


def test_the_pass_count_follows_transformers(esmfold):
    assert trunk_passes(esmfold.trunk, 0) == 1 and trunk_passes(esmfold.trunk, 3) == 4
    assert trunk_passes(esmfold.trunk, None) == esmfold.trunk.config.max_recycles
