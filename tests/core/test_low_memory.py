"""Bounded-memory quantize (issue 13): streaming mode, mapped weights, the up-front memory check."""

import json

import pytest
import torch
from tiny_fixtures import write_fair_esm2

import ptq_protein as pp
from ptq_protein.cli.main import main
from ptq_protein.models.loading import load_model
from ptq_protein.models.mapped import mapped_file_of
from ptq_protein.models.tiny import build_tiny
from ptq_protein.nn.convert import cache_dequantized_weights
from ptq_protein.workflows import memory_budget as budget
from ptq_protein.workflows.streaming import quantize_streaming

SEQS = ["MKTAYIAKQRQISFVKSHFSRQ", "GSHMLEDPVAGK", "MQIFVKTLTGKTITLEVEPSDTIENVKAKIQDKEG"]


def _tensors(qmodel):
    return {k: v.clone() for k, v in qmodel.state_dict().items()}


@pytest.mark.parametrize("recipe", ["w8a8-uniform", "w8a8-pwlq"])
def test_streaming_equals_default_mode_bit_for_bit(tmp_path, recipe):
    path = write_fair_esm2(tmp_path / "esm2_t6_8M_UR50D.pt")
    default = pp.quantize(load_model(path).model, recipe, calibration=SEQS, batch_size=2, inplace=True)
    streamed = quantize_streaming(path, recipe, calibration=SEQS, batch_size=2)
    a, b = _tensors(default), _tensors(streamed)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert default.ptq_state.quantized == streamed.ptq_state.quantized
    assert default.ptq_state.report == streamed.ptq_state.report
    tokens = torch.tensor([[0, 20, 15, 11, 2]])
    assert torch.equal(default(tokens)["logits"], streamed(tokens)["logits"])


@pytest.mark.parametrize("recipe, why", [("w8a8-smoothquant-pwlq", "change the model"),
                                         ("study-w8", "the study's own pipeline")])
def test_streaming_refuses_a_recipe_whose_passes_it_cannot_stream(tmp_path, recipe, why):
    from ptq_protein.support.errors import InputError

    path = write_fair_esm2(tmp_path / "esm2_t6_8M_UR50D.pt")
    with pytest.raises(InputError, match=f"{why}.*without --low-memory"):
        quantize_streaming(path, recipe, calibration=SEQS)


def test_streaming_quantized_propagation_differs_only_after_the_first_layer(tmp_path):
    path = write_fair_esm2(tmp_path / "m.pt")
    fp = quantize_streaming(path, "w8a8-uniform", calibration=SEQS, batch_size=2)
    seq = quantize_streaming(path, "w8a8-uniform", calibration=SEQS, batch_size=2, propagate="quantized")
    first = [k for k in fp.state_dict() if k.startswith("layers.0.")]
    assert all(torch.equal(fp.state_dict()[k], seq.state_dict()[k]) for k in first)
    scales = [k for k in fp.state_dict() if k.startswith("layers.1.") and k.endswith("input_quant.scale")]
    assert scales and any(not torch.equal(fp.state_dict()[k], seq.state_dict()[k]) for k in scales)


def test_mapped_weights_give_the_same_model_and_survive_release(tmp_path):
    path = write_fair_esm2(tmp_path / "m.pt", seed=3)
    mapped, plain = load_model(path, mmap=True), load_model(path)
    handle = mapped_file_of(mapped.model)
    assert handle is not None and mapped_file_of(plain.model) is None
    tokens = torch.tensor([[0, 5, 6, 7, 2]])
    with torch.no_grad():
        before = mapped.model(tokens)["logits"]
        handle.release(mapped.model.parameters())
        after = mapped.model(tokens)["logits"]
    assert torch.equal(before, after) and torch.equal(before, plain.model(tokens)["logits"].detach())
    assert not handle.contains(torch.zeros(4096))  # anonymous memory is never released


def test_quantize_in_place_keeps_no_float_copy_of_linear_weights(tmp_path):
    model = load_model(write_fair_esm2(tmp_path / "m.pt")).model
    q = pp.quantize(model, "w8-only", inplace=True)
    assert q is model
    lin = q.layers[0].fc1
    assert lin._dequantized is None and lin.weight_codes.dtype == torch.int8
    assert cache_dequantized_weights(q) > 0
    with torch.no_grad():
        q(torch.tensor([[0, 5, 6, 2]]))
    assert lin._dequantized is not None and lin._dequantized.dtype == torch.float32


def test_memory_check_refuses_with_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    path = write_fair_esm2(tmp_path / "m.pt")
    monkeypatch.setattr(budget, "available_memory_bytes", lambda: 1 << 20)
    code = main(["quantize", str(path), "--calib", "casp14:2", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs ~" in err[0] and "even layer by layer (--low-memory)" in err[0]
    assert not (tmp_path / "out").exists()


def _between_the_modes(monkeypatch):
    """Make the machine too small for the default mode and large enough for --low-memory."""
    real, seen = budget.estimate_quantize_memory, {}

    def estimate(size, *, low_memory, calibration_tokens, gptq=False):
        seen["args"] = (size, calibration_tokens)
        return real(size, low_memory=low_memory, calibration_tokens=calibration_tokens, gptq=gptq)

    def available():  # under the default mode of any recipe, GPTQ's or not
        size, tokens = seen["args"]
        return (real(size, low_memory=False, calibration_tokens=tokens).needed_bytes
                + real(size, low_memory=True, calibration_tokens=tokens).needed_bytes) // 2

    monkeypatch.setattr(budget, "estimate_quantize_memory", estimate)
    monkeypatch.setattr(budget, "available_memory_bytes", available)


def test_quantize_streams_by_itself_when_only_low_memory_fits(tmp_path, monkeypatch, caplog, capsys):
    from safetensors.torch import load_file

    path = write_fair_esm2(tmp_path / "esm2_t6_8M_UR50D.pt")
    common = ["quantize", str(path), "--preset", "w8a8-uniform", "--calib", "casp14:3", "--quiet"]
    assert main(common + ["--out", str(tmp_path / "a")]) == 0  # ample memory: the default mode
    capsys.readouterr()
    _between_the_modes(monkeypatch)
    with caplog.at_level("WARNING", logger="ptq_protein.workflows.memory_budget"):
        assert main(common + ["--out", str(tmp_path / "b"), "--json"]) == 0
    assert any("quantizing layer by layer instead" in r.getMessage() for r in caplog.records)
    assert json.loads(capsys.readouterr().out)["low_memory"].startswith("chosen")
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_no_silent_switch_when_the_run_cannot_stream(tmp_path, monkeypatch, capsys):
    path = write_fair_esm2(tmp_path / "esm2_t6_8M_UR50D.pt")
    _between_the_modes(monkeypatch)
    code = main(["quantize", str(path), "--calib", "casp14:2", "--compare", "w8a8-uniform",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs ~" in err[0] and "--compare needs the float model whole" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("asked", [True, False])
def test_the_esm2_default_streams_the_streamable_recipe_and_says_so(tmp_path, monkeypatch, capsys, asked):
    """ESM-2's --bits 8 default (SmoothQuant, then GPTQ) changes the whole model first: streamed, asked for or
    chosen to fit, the run takes w8a8-pwlq, says so in one line, and writes what --preset w8a8-pwlq writes."""
    from safetensors.torch import load_file

    path = write_fair_esm2(tmp_path / "esm2_t6_8M_UR50D.pt")
    common = ["quantize", str(path), "--calib", "casp14:3", "--quiet", "--check", "0"]
    assert main(common + ["--preset", "w8a8-pwlq", "--low-memory", "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    if not asked:
        _between_the_modes(monkeypatch)
    assert main(common + ["--out", str(tmp_path / "b")] + ["--low-memory"] * asked) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("streaming layer by layer")]
    assert len(notes) == 1 and "w8a8-pwlq" in notes[0] and "w8a8-smoothquant-gptq-lntoken" in notes[0]
    assert json.loads((tmp_path / "b" / "recipe.json").read_text())["config"]["name"] == "w8a8-pwlq"
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_low_memory_refuses_a_named_recipe_it_cannot_stream_before_loading(tmp_path, capsys):
    path = write_fair_esm2(tmp_path / "esm2_t6_8M_UR50D.pt")
    code = main(["quantize", str(path), "--preset", "w8a8-smoothquant-gptq-pertoken", "--low-memory",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "cannot stream" in err[0] and "drop --low-memory" in err[0]
    assert not (tmp_path / "out").exists()


def test_memory_estimate_orders_the_modes():
    size = 2_600_000_000
    full = budget.estimate_quantize_memory(size, low_memory=False, calibration_tokens=520)
    low = budget.estimate_quantize_memory(size, low_memory=True, calibration_tokens=520)
    assert low.needed_bytes < 0.6 * full.needed_bytes
    assert full.needed_bytes > size  # never claims less than the float weights in the default mode


def test_cli_low_memory_writes_the_default_modes_artifact(tmp_path):
    from safetensors.torch import load_file

    path = write_fair_esm2(tmp_path / "esm2_t6_8M_UR50D.pt")
    common = ["quantize", str(path), "--preset", "w8a8-uniform", "--calib", "casp14:3", "--quiet"]
    assert main(common + ["--out", str(tmp_path / "a")]) == 0
    assert main(common + ["--out", str(tmp_path / "b"), "--low-memory"]) == 0
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert main(["quantize", "tiny-esm2", "--low-memory", "--out", str(tmp_path / "c")]) == 2


def test_mapped_forward_trims_the_heap_only_after_resident_growth(tmp_path, monkeypatch):
    from ptq_protein.models import mapped as mapped_mod

    path = write_fair_esm2(tmp_path / "m.pt", seed=3)
    loaded = load_model(path, mmap=True)
    resident, trims = [1000], []
    monkeypatch.setattr(mapped_mod, "resident_bytes", lambda: resident[0])
    monkeypatch.setattr(mapped_mod, "trim_heap", lambda: trims.append(resident[0]))
    monkeypatch.setattr(mapped_mod, "TRIM_GROWTH", 100)
    handle = mapped_file_of(loaded.model)
    handle._trim_floor = 1000
    tokens = torch.tensor([[0, 5, 6, 7, 2]])
    with torch.no_grad(), mapped_mod.release_after_forward(loaded.model, handle):
        loaded.model(tokens)
        assert trims == []  # no growth: no trim (trimming costs page faults later)
        resident[0] = 1101
        loaded.model(tokens)
        assert trims == [1101]  # grew past the threshold: one trim, and the floor moves with it
        loaded.model(tokens)
        assert trims == [1101]


def test_release_keeps_the_pages_of_a_weight_edited_in_place(tmp_path):
    """A mapped page written after loading is this process's copy: handing it back would restore the file's bytes."""
    loaded = load_model(write_fair_esm2(tmp_path / "m.pt"), mmap=True)
    handle = mapped_file_of(loaded.model)
    weight = loaded.model.layers[0].fc1.weight  # 256 x 64 float32: whole pages inside
    with torch.no_grad():
        weight.mul_(2.0)
    edited = weight.detach().clone()
    handle.release([weight])
    assert torch.equal(weight, edited)
    untouched = loaded.model.layers[1].fc1.weight
    float(untouched.detach().sum())  # read from the file: resident, clean
    assert handle.release([untouched]) > 0  # clean pages still go back


def _edits_the_model(name):
    from ptq_protein.passes.recipe import resolve_recipe
    from ptq_protein.recipes.presets import get_preset

    cfg = get_preset(name)
    return any(p.needs(cfg, []).changes_model for p in resolve_recipe(cfg).passes)


@pytest.mark.parametrize("recipe", [n for n in pp.PRESETS if _edits_the_model(n)])
def test_a_mapped_checkpoint_quantizes_in_place_as_one_read_into_memory(tmp_path, recipe):
    """SmoothQuant folds its scales into the weights, GPTQ rounds them and the SwiGLU rotation multiplies them,
    in place; the calibration that follows hands mapped pages back. Both must see the edited weights: the quantize
    CLI runs exactly this (mmap, in place). The rotation applies to ESM C only: an official-layout ESM C file."""
    if pp.get_preset(recipe).rotate_ffn:
        path = tmp_path / "esmc.pth"
        torch.save(build_tiny("tiny-esmc")[0].state_dict(), path)
    else:
        path = write_fair_esm2(tmp_path / "m.pt")
    plain = pp.quantize(load_model(path).model, recipe, calibration=SEQS, batch_size=1, inplace=True)
    mapped = pp.quantize(load_model(path, mmap=True).model, recipe, calibration=SEQS, batch_size=1, inplace=True)
    a, b = _tensors(plain), _tensors(mapped)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert plain.ptq_state.report == mapped.ptq_state.report


def test_a_mapped_esmfold_file_smooths_its_trunk_in_place_as_one_in_memory(tmp_path):
    """fair-esm ESMFold files are memory-mapped too; SmoothQuant folds into the ESM-2 stem and the trunk's
    LayerNorm -> Linear pairs (trunk.blocks.*), which the released pages had reverted (76 tensors differed)."""
    import types

    from ptq_protein.models.esmfold_convert import hf_esmfold_to_fair
    from ptq_protein.models.tiny import tiny_esmfold, tiny_esmfold_config

    model, _ = tiny_esmfold()
    path = tmp_path / "esmfold.pt"
    torch.save({"model": dict(hf_esmfold_to_fair(model.state_dict()).state_dict),
                "cfg": {"model": types.SimpleNamespace(trunk={"num_blocks": 2})}}, path)
    cfg = tiny_esmfold_config()
    runs = [pp.quantize(load_model(path, config=cfg, mmap=mm).model, "w8a8-smoothquant", calibration=SEQS[:2],
                        batch_size=1, inplace=True) for mm in (False, True)]
    a, b = _tensors(runs[0]), _tensors(runs[1])
    assert any(k.startswith("trunk.blocks.") for k in a)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_the_estimate_counts_gptq_where_the_default_mode_runs_it():
    """GPTQ in the default mode peaked at 2.75x a 650M file (w8a8-pwlq: 0.47x): its estimate carries that, so a
    machine the default recipe does not fit streams (or refuses) before loading instead of running out of memory."""
    size = 2_600_000_000
    plain = budget.estimate_quantize_memory(size, low_memory=False, calibration_tokens=520)
    gptq = budget.estimate_quantize_memory(size, low_memory=False, calibration_tokens=520, gptq=True)
    low = budget.estimate_quantize_memory(size, low_memory=True, calibration_tokens=520, gptq=True)
    assert gptq.needed_bytes >= 2.75 * size > plain.needed_bytes
    streamed = budget.estimate_quantize_memory(size, low_memory=True, calibration_tokens=520)
    assert low.needed_bytes == streamed.needed_bytes  # --low-memory streams recipes without GPTQ
