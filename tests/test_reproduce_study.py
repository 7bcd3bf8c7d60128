"""scripts/reproduce_study.py: every study row has a study-exact recipe, and the table prints every row."""

import importlib.util
import sys
from pathlib import Path

import ptq_protein as pp

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "reproduce_study.py"


def _script():
    spec = importlib.util.spec_from_file_location("reproduce_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_row_names_presets_and_prints():
    script = _script()
    recipes = [r for row in script.STRUCTURE_ROWS for r in row[1:3] if r]
    assert all(r in pp.PRESETS for r in recipes)
    assert all(row[1] == "fp" or row[1].startswith("study-") for row in script.STRUCTURE_ROWS)
    means = {r: (0.5, 3) for r in recipes}
    table = script.format_table(means, "tiny-esmfold", 128, "cpu")
    for row in script.STRUCTURE_ROWS:
        line = next(line_ for line_ in table.splitlines() if line_.startswith(f"| {row[0]} |"))
        assert (row[3] is None or f"{row[3]:.4f}" in line) and "0.5000 (3)" in line
    assert "9 bits per value" in table and "toolkit check" in table and "cropped to 128" in table
    assert "normalised by the prediction's length" in table and "float16 stem" in table
    assert "missing" in script.format_table({}, "esmfold", None)


def test_the_table_shows_what_the_published_numbers_are():
    """The 0.7418 all-sites row beside the part rows, their label, and where the numbers came from."""
    script = _script()
    table = script.format_table({}, "esmfold", None, "cuda")
    everything = next(line_ for line_ in table.splitlines() if line_.startswith("| all sites |"))
    assert "0.7418" in everything
    for row in ("LayerNorm inputs only", "Linear inputs only", "ESM-2 only", "trunk only", "all sites"):
        line = next(line_ for line_ in table.splitlines() if line_.startswith(f"| {row} |"))
        assert "configuration not recorded in the study's code (notebook comment)" in line
    w8 = next(line_ for line_ in table.splitlines() if line_.startswith("| W8, notebook key filter |"))
    assert "0.8010 (notebook)" in w8  # the notebook's 0.8010496, not 0.8011
    assert "`linear_quant`" in table and "`piecewise_quant`" in table and "`trunk.structure_module`" in table
    assert "cropped" not in table and "float16 stem" not in table  # whole sequences on CUDA: nothing to say


def test_the_crop_the_run_used_is_read_from_run_json(tmp_path):
    script = _script()
    assert script.recorded_crop(tmp_path) is None
    (tmp_path / "run.json").write_text('{"calib_max_length": 128, "model": "tiny-esmfold"}', encoding="utf-8")
    assert script.recorded_crop(tmp_path) == 128


def test_the_structure_run_asks_for_the_study_normalisation():
    from ptq_protein.cli.main import build_parser

    args = build_parser().parse_args(["eval", "structure", "--model", "tiny-esmfold", "--out", "x",
                                      *_script().STUDY_TM_NORMALIZE])
    assert args.tm_normalize == "sequence"
