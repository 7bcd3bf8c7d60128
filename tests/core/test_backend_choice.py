"""Which backend a loaded artifact runs when none is named (``nn/backend_choice``)."""

import logging

import pytest
import torch

import ptq_protein as pp
from ptq_protein.nn import backend_choice, cpu_int8
from ptq_protein.recipes.config import Backend
from ptq_protein.recipes.presets import PRESETS, get_preset


@pytest.mark.parametrize("mode, want", [("native", Backend.INT8), ("split", Backend.INT8), (None, Backend.FAKE)])
def test_cpu_runs_integer_gemms_where_they_are_exact(monkeypatch, mode, want):
    monkeypatch.setattr(cpu_int8, "mode", lambda: mode)
    monkeypatch.setattr(cpu_int8, "reason", lambda: "no oneDNN int8 linear in this PyTorch build")
    backend, why = backend_choice.choose_backend(get_preset("w8a8-uniform"), torch.device("cpu"))
    assert backend is want
    assert ("split against" in why) if mode == "split" else ("natively" in why if mode else "no oneDNN" in why)


def test_a_gpu_runs_the_recorded_backend():
    for recorded in Backend:
        backend, why = backend_choice.choose_backend(get_preset("w8a8-uniform").replace(backend=recorded),
                                                     torch.device("cuda"))
        assert backend is recorded and "opt-in" in why


@pytest.mark.skipif(not cpu_int8.available(), reason=cpu_int8.reason())
def test_load_picks_int8_and_says_why_once(esm2, seqs, tmp_path, caplog):
    pp.save(pp.quantize(esm2, "w8a8-uniform", calibration=seqs), tmp_path / "a")  # recorded backend: fake
    backend_choice.announce.cache_clear()
    with caplog.at_level(logging.INFO, logger="ptq_protein.nn.backend_choice"):
        model = pp.load(tmp_path / "a")
        pp.load(tmp_path / "a")
        fake = pp.load(tmp_path / "a", backend="fake")
    lines = [r.getMessage() for r in caplog.records if r.name == "ptq_protein.nn.backend_choice"]
    assert len(lines) == 1 and "integer GEMMs" in lines[0] and backend_choice.cpu_isa() in lines[0]
    assert {m.backend for m in model.modules() if hasattr(m, "engine_ran")} == {Backend.INT8}
    assert {m.backend for m in fake.modules() if hasattr(m, "engine_ran")} == {Backend.FAKE}


# ESMFold-only recipes (trunk_dtype) load with default options in tests/core/test_trunk_dtype.py
@pytest.mark.parametrize("preset", [n for n, c in PRESETS.items()
                                    if c.study is None and n != "fp" and not c.trunk_dtype])
def test_every_saveable_preset_loads_with_default_options(request, seqs, tmp_path, preset):
    """Choosing the fast path must never turn a loadable artifact into a refusal: a recipe integer GEMMs
    cannot run (FP8, piecewise-linear weights) keeps its recorded simulation, bit for bit. On ESM-2, and on ESM C
    for the recipes that only ESM C takes (the SwiGLU rotation); both read these token ids alike."""
    model = request.getfixturevalue("esmc" if PRESETS[preset].rotate_ffn else "esm2")
    pp.save(pp.quantize(model, preset, calibration=seqs), tmp_path / "a")
    backend, why = backend_choice.choose_backend(get_preset(preset), torch.device("cpu"))
    model, fake = pp.load(tmp_path / "a"), pp.load(tmp_path / "a", backend="fake")
    tokens = torch.tensor([[0, 20, 15, 11, 2]])
    if backend is Backend.FAKE:
        assert preset in why or not cpu_int8.available()
        assert torch.equal(model(tokens)["logits"], fake(tokens)["logits"])
    else:
        assert torch.isfinite(model(tokens)["logits"]).all()


@pytest.mark.skipif(not cpu_int8.available(), reason=cpu_int8.reason())
def test_the_log_says_what_onednn_was_held_to(esm2, tmp_path):
    """Under ONEDNN_MAX_CPU_ISA=AVX2 the line said "oneDNN on AVX-512 VNNI ... (no VNNI)", two claims at odds."""
    import os
    import subprocess
    import sys

    art = tmp_path / "art"
    pp.save(pp.quantize(esm2, "w8a8-uniform", calibration=["MKTAYIAKQRQISFVKSHFSRQ", "GSHMLEDPVAGK"]), art)
    fasta = tmp_path / "x.fasta"
    fasta.write_text(">a\nMKTAYIAK\n")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    run = subprocess.run([sys.executable, "-m", "ptq_protein.cli.main", "embed", str(art), str(fasta), "--out",
                          str(tmp_path / "o")], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    (line,) = [x for x in run.stderr.splitlines() if "integer GEMMs (backend 'int8'" in x]
    assert f"oneDNN held to AVX2 by ONEDNN_MAX_CPU_ISA (this CPU: {backend_choice.cpu_isa()})" in line
    assert "oneDNN on" not in line
