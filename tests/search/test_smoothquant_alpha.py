"""SmoothQuant's alpha chosen per model: the grid search scores what it says, picks the minimum, and the CLI says so."""

import dataclasses
import json

import pytest
from tiny_fixtures import write_fair_esm2

import ptq_protein as pp
from ptq_protein.cli.main import main
from ptq_protein.eval.bench.fidelity import compare_models
from ptq_protein.search.smoothquant_alpha import search_smoothquant_alpha
from ptq_protein.support.errors import InputError


def test_search_scores_each_alpha_and_returns_the_best(esm2, calib_seqs, metric_seqs):
    before = {k: v.clone() for k, v in esm2.state_dict().items()}
    cfg, trials = search_smoothquant_alpha(esm2, "w8a8-smoothquant", metric_seqs, alphas=(0.2, 0.5, 0.9),
                                           calibration=calib_seqs)
    assert [t.alpha for t in trials] == [0.2, 0.5, 0.9]
    best = min(trials, key=lambda t: t.relative_error)
    assert cfg.smoothquant.alpha == best.alpha and cfg.name == "w8a8-smoothquant"
    # each trial's error is that of an independent quantize + comparison at its alpha
    base = pp.get_preset("w8a8-smoothquant")
    for trial in (trials[0], trials[2]):
        at = base.replace(smoothquant=dataclasses.replace(base.smoothquant, alpha=trial.alpha))
        again = compare_models(esm2, pp.quantize(esm2, at, calibration=calib_seqs), metric_seqs)
        assert again["relative_error"] == pytest.approx(trial.relative_error, rel=1e-6)
    assert len({t.relative_error for t in trials}) == 3  # alpha changes the quantized model
    assert all(v.equal(esm2.state_dict()[k]) for k, v in before.items())  # the caller's model is untouched


def test_no_smoothing_is_a_grid_point_and_wins_where_it_errs_least(esm2, calib_seqs, metric_seqs):
    """None on the grid quantizes without SmoothQuant: its error is that recipe's, and the search returns the
    recipe without SmoothQuant when that error is the least."""
    cfg, trials = search_smoothquant_alpha(esm2, "w8a8-smoothquant", metric_seqs, alphas=(None, 1.0),
                                           calibration=calib_seqs)
    plain = pp.get_preset("w8a8-smoothquant").replace(smoothquant=None)
    again = compare_models(esm2, pp.quantize(esm2, plain, calibration=calib_seqs), metric_seqs)
    assert trials[0].alpha is None and trials[0].relative_error == pytest.approx(again["relative_error"], rel=1e-6)
    best = min(trials, key=lambda t: t.relative_error)
    assert (cfg.smoothquant is None) == (best.alpha is None)
    only_off, [trial] = search_smoothquant_alpha(esm2, "w8a8-smoothquant", metric_seqs, alphas=(None,),
                                                 calibration=calib_seqs)
    assert only_off.smoothquant is None and trial.relative_error == trials[0].relative_error


def test_search_refuses_recipes_without_smoothquant_and_bad_grids(esm2, metric_seqs):
    with pytest.raises(InputError, match="no SmoothQuant step"):
        search_smoothquant_alpha(esm2, "w8a8-uniform", metric_seqs)
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        search_smoothquant_alpha(esm2, "w8a8-smoothquant", metric_seqs, alphas=(0.5, 1.5))


@pytest.mark.parametrize("argv, words", [
    (["--preset", "w8a8-uniform", "--smoothquant-alpha", "0.6"], "applies to SmoothQuant presets"),
    (["--preset", "w8a8-smoothquant", "--smoothquant-alpha", "high"], "must be a number in [0, 1] or 'auto'"),
    (["--preset", "w8a8-smoothquant", "--smoothquant-alpha", "1.2"], "must be a number in [0, 1] or 'auto'"),
])
def test_cli_refuses_bad_alpha_in_one_line(tmp_path, capsys, argv, words):
    assert main(["quantize", "tiny-esm2", *argv, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and not (tmp_path / "a").exists()


def test_cli_auto_alpha_is_recorded_in_the_summary_and_the_artifact(tmp_path, capsys):
    out = tmp_path / "a"
    code = main(["quantize", "tiny-esm2", "--preset", "w8a8-smoothquant", "--smoothquant-alpha", "auto",
                 "--calib", "casp14:4", "--check", "2", "--compare", "none", "--json", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    search = json.loads(captured.out)["smoothquant_alpha"]
    assert [t["alpha"] for t in search["trials"]] == [None, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    assert len(search["scored_on"]) == 2
    assert search["chosen"] == min(search["trials"], key=lambda t: t["relative_error"])["alpha"]
    smoothing = pp.load(out).ptq_state.config.smoothquant
    assert (smoothing is None) if search["chosen"] is None else smoothing.alpha == search["chosen"]


def test_alpha_with_the_default_recipe_of_a_file_waits_for_its_family(tmp_path, capsys):
    """ESM-2's default (with SmoothQuant) takes --smoothquant-alpha from a .pt file too; a recipe without SmoothQuant
    still refuses it in one line, before calibrating anything."""
    path = write_fair_esm2(tmp_path / "esm2_t6_8M_UR50D.pt")
    common = ["quantize", str(path), "--calib", "casp14:2", "--check", "0", "--compare", "none", "--quiet"]
    assert main(common + ["--smoothquant-alpha", "0.4", "--out", str(tmp_path / "a")]) == 0, capsys.readouterr().err
    config = pp.load(tmp_path / "a").ptq_state.config
    assert config.name.startswith("w8a8-smoothquant-gptq-lntoken") and config.smoothquant.alpha == 0.4
    capsys.readouterr()
    assert main(common + ["--bits", "4", "--smoothquant-alpha", "0.4", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "applies to SmoothQuant presets" in err and "\n" not in err and not (tmp_path / "b").exists()
