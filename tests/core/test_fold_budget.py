"""The fold's memory check: the memory model's shape, the chunk it picks, one-line refusals that spare the others."""

import dataclasses
import logging
import math
import weakref

import pytest
import torch

from ptq_protein.cli.common import parse_memory_size
from ptq_protein.cli.main import main
from ptq_protein.eval.bench import fold_budget
from ptq_protein.eval.bench.fold_budget import FoldRefused, longest_fitting, planned_fold
from ptq_protein.models.fold_memory import (
    CHUNK_CHOICES,
    HEAP_SHARE_GROWTH,
    HEAP_SHARE_MAX,
    PAIR_INT8_ROWS,
    RUNTIME_BYTES,
    FoldDims,
    FoldPlan,
    choose_plan,
    dims_of,
    heap_share,
    pair_int8_vector_bytes,
    predict_peak,
)

REAL = FoldDims(c_z=128, seq_heads=32, pair_heads=4, bins=64, stem_heads=20, weight_bytes=150 << 20)


@pytest.fixture(autouse=True)
def _no_margins(monkeypatch):
    """Each test starts with no measured margins: an earlier in-process fold of the session's tiny model must not
    change the plans asserted here."""
    monkeypatch.setattr(fold_budget, "_MARGINS", weakref.WeakKeyDictionary())


def test_the_heap_slack_grows_with_the_trunk_block_forwards_a_fold_runs():
    """48 blocks x 4 passes hold more freed blocks than 1 block x 2: the share of the live tensors, by passes."""
    assert heap_share(1) == heap_share(2) == 0.0
    assert math.isclose(heap_share(2 * math.e), HEAP_SHARE_GROWTH)  # the closed form: per e-fold beyond two
    assert heap_share(10 ** 9) == HEAP_SHARE_MAX
    v1 = dataclasses.replace(REAL, blocks=48, trunk_passes=4)
    assert predict_peak(v1, FoldPlan(100)) == predict_peak(v1, FoldPlan(100, recycles=3))  # the model's own: 4
    one = predict_peak(v1, FoldPlan(100, recycles=0))
    grown = [predict_peak(v1, FoldPlan(100, recycles=r)) - one for r in (1, 3)]
    # only the slack term differs, share x the same live tensors: the steps are in the shares' ratio
    expected = (heap_share(96) - heap_share(48)) / (heap_share(192) - heap_share(48))
    assert grown[1] > grown[0] > 0 and math.isclose(grown[0] / grown[1], expected, rel_tol=1e-6)


def test_the_fold_plans_with_the_recycles_it_runs(esmfold, monkeypatch):
    seen = []
    chosen = fold_budget.choose_plan
    monkeypatch.setattr(fold_budget, "choose_plan", lambda *a, **k: seen.append(k["recycles"]) or chosen(*a, **k))
    with planned_fold(esmfold, 50, 10 << 40, recycles=2) as plan:
        assert plan.recycles == 2
    assert seen == [2]


def test_the_pair_terms_grow_as_length_squared_and_the_unchunked_attention_as_its_cube():
    # steps between lengths whose live tensors are past the heap's slack cap (a constant from there on)
    peaks = {n: predict_peak(REAL, FoldPlan(n, chunk=32)) for n in (512, 1024, 2048)}
    quadratic = [peaks[1024] - peaks[512], peaks[2048] - peaks[1024]]
    assert quadratic[1] / quadratic[0] == pytest.approx(4, rel=0.02)
    cubic = [predict_peak(REAL, FoldPlan(n)) - predict_peak(REAL, FoldPlan(n, chunk=32)) for n in (1024, 2048)]
    assert cubic[1] / cubic[0] == pytest.approx(8, rel=0.05)


def test_smaller_chunks_bf16_and_int8_pairs_each_need_less():
    n = 1024
    peaks = [predict_peak(REAL, FoldPlan(n, chunk=c)) for c in (None, 128, 64, 32)]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 4
    bf16 = FoldDims(**{**REAL.__dict__, "act_bytes": 2})
    assert predict_peak(bf16, FoldPlan(n, chunk=64)) < predict_peak(REAL, FoldPlan(n, chunk=64))
    assert predict_peak(REAL, FoldPlan(n, chunk=64, pair_bits=8)) < 0.5 * predict_peak(REAL, FoldPlan(n, chunk=64))


def test_choose_plan_takes_the_largest_chunk_that_fits_or_none():
    n = 700
    budget = (predict_peak(REAL, FoldPlan(n, chunk=64)) + predict_peak(REAL, FoldPlan(n, chunk=128))) // 2
    assert choose_plan(REAL, n, budget).chunk == 64
    assert choose_plan(REAL, n, 10 << 40).chunk is None
    assert choose_plan(REAL, n, 1 << 20) is None


def test_the_int8_row_chunk_and_vector_bytes_are_the_runtimes():
    from ptq_protein.nn.pair_int8.holder import Int8Pair
    from ptq_protein.nn.pair_int8.trunk import ROWS

    assert PAIR_INT8_ROWS == ROWS
    for c_z in (128, 32, 20):  # 20: not a multiple of the group, one scale and offset per vector
        pair = Int8Pair(1, 3, c_z, torch.float32)
        assert pair.nbytes == 9 * pair_int8_vector_bytes(c_z)
    assert pair_int8_vector_bytes(128) == 128 + 8 * 4 and pair_int8_vector_bytes(20) == 20 + 4


def test_dims_are_read_from_the_model(esmfold):
    dims = dims_of(esmfold)
    assert (dims.c_z, dims.seq_heads, dims.pair_heads, dims.bins, dims.stem_heads) == (32, 4, 2, 64, 4)
    assert dims.weight_bytes == 4 * sum(p.numel() for p in esmfold.parameters()) + sum(
        b.numel() * b.element_size() for b in esmfold.buffers())


def test_the_base_is_what_the_process_holds_when_that_is_more():
    # The runtime constant was measured on one install; a process holding more (a CUDA build of torch, other
    # models) starts its fold from there: the fold's own bytes are added to the larger of the two.
    plan = FoldPlan(800, chunk=4, pair_bits=8)
    own = predict_peak(REAL, plan) - RUNTIME_BYTES - REAL.weight_bytes
    assert predict_peak(REAL, plan, resident=1 << 20) == predict_peak(REAL, plan)
    assert predict_peak(REAL, plan, resident=3 << 30) == (3 << 30) + own
    assert choose_plan(REAL, 800, predict_peak(REAL, plan), pair_bits=8, resident=3 << 30) is None


def test_planned_fold_counts_what_the_process_holds(esmfold, monkeypatch):
    dims = dims_of(esmfold)
    plan = FoldPlan(600, chunk=32)
    budget = predict_peak(dims, plan)
    monkeypatch.setattr(fold_budget, "resident_before_fold", lambda: 0)
    with planned_fold(esmfold, 600, budget) as chosen:
        assert chosen.chunk == 32
    monkeypatch.setattr(fold_budget, "resident_before_fold", lambda: budget)  # nothing left for the fold's own
    with pytest.raises(FoldRefused, match="600 residues need"):
        with planned_fold(esmfold, 600, budget):
            pass


def test_planned_fold_sets_the_chunk_for_one_fold_and_says_so(esmfold, caplog, monkeypatch):
    monkeypatch.setattr(fold_budget, "resident_before_fold", lambda: 0)  # the test process's own size aside
    dims = dims_of(esmfold)
    budget = (predict_peak(dims, FoldPlan(600, chunk=32)) + predict_peak(dims, FoldPlan(600, chunk=64))) // 2
    with caplog.at_level(logging.WARNING):
        with planned_fold(esmfold, 600, budget) as plan:
            assert plan.chunk == 32 and esmfold.trunk.chunk_size == 32
    assert esmfold.trunk.chunk_size is None
    assert "chunk size 32" in caplog.text
    with pytest.raises(FoldRefused, match=r"600 residues need ~.* GiB.*up to \d+ residues fit.*--pair-bits 8"):
        with planned_fold(esmfold, 600, predict_peak(dims, FoldPlan(600, chunk=CHUNK_CHOICES[-1])) - 1):
            pass
    assert longest_fitting(esmfold, budget, None, CHUNK_CHOICES[-1]) >= 600


def test_fold_refuses_what_cannot_fit_in_one_line_and_folds_the_rest(esmfold, tmp_path, capsys, monkeypatch):
    from ptq_protein.workflows import memory_budget

    monkeypatch.setattr(fold_budget, "resident_before_fold", lambda: 0)  # the test process's own size aside
    monkeypatch.setattr(memory_budget, "resident_bytes", lambda: 0)  # (it grows over a whole suite's run)
    fasta = tmp_path / "in.fasta"
    fasta.write_text(">short\nMKTAYIAKQRQISFVKSHFSRQ\n>long\n" + "ACDEFGHIKLMNPQRSTVWY" * 30 + "\n")
    budget = predict_peak(dims_of(esmfold), FoldPlan(200, chunk=CHUNK_CHOICES[-1]))  # 22 residues fit, 600 do not
    code = main(["fold", "tiny-esmfold", "--fasta", str(fasta), "--out", str(tmp_path / "o"),
                 "--max-memory", str(budget), "--num-recycles", "0", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert (tmp_path / "o" / "short.pdb").exists() and not (tmp_path / "o" / "long.pdb").exists()
    refusal = [line for line in err.splitlines() if "not folded" in line]
    assert len(refusal) == 1 and "long: 600 residues need ~" in refusal[0] and "GiB" in refusal[0]


def test_fold_with_pair_bits_writes_a_pdb(tmp_path, capsys):
    fasta = tmp_path / "in.fasta"
    fasta.write_text(">a\nMKTAYIAKQRQISFVKSHFSRQ\n")
    assert main(["fold", "tiny-esmfold", "--fasta", str(fasta), "--out", str(tmp_path / "o"), "--pair-bits", "8",
                 "--num-recycles", "0", "--quiet"]) == 0
    assert (tmp_path / "o" / "a.pdb").read_text().startswith(("ATOM", "PARENT", "MODEL", "HEADER"))


@pytest.mark.parametrize("text, expected", [("16G", 16 << 30), ("16GiB", 16 << 30), ("512m", 512 << 20),
                                            ("2.5G", int(2.5 * 2 ** 30)), ("1000", 1000)])
def test_memory_sizes(text, expected):
    assert parse_memory_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1G", "0", "16X"])
def test_bad_memory_sizes_are_refused(text):
    with pytest.raises(ValueError, match="--max-memory"):
        parse_memory_size(text)


def _polled_peak(monkeypatch, peak: int) -> None:
    """Every fold's polled peak is ``peak`` bytes."""
    class Sampler:
        def __enter__(self):
            self.peak = peak
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(fold_budget, "PeakSampler", Sampler)


def test_a_fold_over_its_prediction_is_reported_and_later_folds_keep_the_margin(esmfold, caplog, monkeypatch):
    """The check after each fold: its own polled peak against the prediction; a miss is not repeated."""
    monkeypatch.setattr(fold_budget, "resident_before_fold", lambda: 0)
    dims = dims_of(esmfold)
    budget = predict_peak(dims, FoldPlan(600, chunk=64))  # chunk 64 just fits
    _polled_peak(monkeypatch, int(1.2 * budget))  # the fold overran by 20%
    with caplog.at_level(logging.WARNING):
        with planned_fold(esmfold, 600, budget) as first:
            assert first.chunk == 64
    assert "20% over its predicted" in caplog.text
    with planned_fold(esmfold, 600, budget) as second:  # planned within budget / 1.2
        assert second.chunk < 64
        assert predict_peak(dims, second) * 1.2 <= budget
    other = type(esmfold)(esmfold.config)  # another model has no margin of its own
    with planned_fold(other, 600, budget) as plan:
        assert plan.chunk == 64


def test_a_fold_over_its_budget_says_so_in_one_line(esmfold, caplog, monkeypatch):
    """A fold within its prediction's tolerance but over the budget it was given is reported, not silent."""
    monkeypatch.setattr(fold_budget, "resident_before_fold", lambda: 0)
    model = type(esmfold)(esmfold.config)  # no margin from an earlier fold
    budget = predict_peak(dims_of(model), FoldPlan(600, chunk=64))
    predicted = predict_peak(dims_of(model), FoldPlan(600, chunk=64))
    _polled_peak(monkeypatch, int(1.1 * predicted))  # within 15% of the prediction, 10% over the budget
    with caplog.at_level(logging.WARNING):
        with planned_fold(model, 600, budget) as plan:
            assert plan.chunk == 64
    lines = [r.getMessage() for r in caplog.records if "peaked" in r.getMessage()]
    assert len(lines) == 1 and "over the" in lines[0] and "memory budget" in lines[0], lines


def test_a_miss_that_changes_no_plan_is_not_warned_but_kept_and_said_once_it_changes_one(esmfold, caplog,
                                                                                          monkeypatch):
    """Warnings only where a plan changes: 10% over the prediction within a roomy budget is a debug line; the
    margin it leaves is said on the later fold it moves to a smaller chunk."""
    monkeypatch.setattr(fold_budget, "resident_before_fold", lambda: 0)
    model = type(esmfold)(esmfold.config)  # no margin from an earlier fold
    dims = dims_of(model)
    roomy = 10 * predict_peak(dims, FoldPlan(600))
    _polled_peak(monkeypatch, int(1.1 * predict_peak(dims, FoldPlan(600))))
    with caplog.at_level(logging.DEBUG, logger=fold_budget.__name__):
        with planned_fold(model, 600, roomy) as plan:
            assert plan.chunk is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("10% over its predicted" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
    caplog.clear()
    tight = predict_peak(dims, FoldPlan(600, chunk=64))  # fits chunk 64 without the margin, 32 with it
    _polled_peak(monkeypatch, 1)
    with caplog.at_level(logging.WARNING):
        with planned_fold(model, 600, tight) as plan:
            assert plan.chunk == 32
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "planned with a 10% margin" in lines[0], lines


def _peak_mark() -> int:
    for line in open("/proc/self/status", encoding="ascii"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    pytest.skip("no VmHWM here")


def test_a_fold_leaves_the_process_peak_users_tools_read(esmfold, monkeypatch):
    """/usr/bin/time and ru_maxrss read the kernel's peak mark: a fold never restarts it."""
    monkeypatch.setattr(fold_budget, "resident_before_fold", lambda: 0)
    big = torch.ones(64 << 20)  # 256 MiB touched, then freed: the process's peak stays above it
    before = _peak_mark()
    del big
    with planned_fold(esmfold, 50, 1 << 40):
        pass
    assert _peak_mark() > before - (64 << 20)  # the kernel's counters are approximate; a restart drops ~256 MiB


def test_the_sampler_sees_a_peak_inside_its_block():
    from ptq_protein.support.rss_peak import PeakSampler

    with PeakSampler() as sampler:
        start = sampler.peak
        if start is None:
            pytest.skip("no /proc/self/statm here")
        big = torch.ones(64 << 20)  # 256 MiB
        del big
    assert sampler.peak >= start + (200 << 20)
