"""``ptq-protein presets``: every registered preset, one line each, grouped, with its marks."""

import json
import subprocess
import sys

from ptq_protein.cli.main import main
from ptq_protein.recipes.presets import PRESET_GROUPS, PRESETS, lm_point


def _listed(capsys, *extra):
    assert main(["presets", *extra]) == 0
    return capsys.readouterr().out


def test_every_registered_preset_is_one_line_under_its_group(capsys):
    out = _listed(capsys)
    lines = out.splitlines()
    titles = [i for i, line in enumerate(lines) if not line.startswith(" ")]
    assert [lines[i].split()[0] for i in titles] == ["ours:", "baselines", "the"]  # ours, baselines, the study's
    for name, group in PRESET_GROUPS.items():
        rows = [i for i, line in enumerate(lines) if line.split()[:1] == [name]]
        assert len(rows) == 1, name
        section = max(t for t in titles if t < rows[0])
        assert lines[section].startswith({"ours": "ours", "baselines": "baselines", "study": "the study"}[group])
    assert sum(1 for line in lines if line.startswith("  ")) == len(PRESETS)


def test_marks_say_esmc_only_and_the_language_model_points(capsys):
    rows = {line.split()[0]: line for line in _listed(capsys).splitlines() if line.startswith("  ")}
    assert "[ESM C]" in rows["w8a8-rotate"] and "[ESM C]" in rows["w8a8-rotate-gptq"]
    assert "[ESM C]" not in rows["w8a8-dynamic"] and "[ESM C]" not in rows["w8a8-pwlq"]
    assert "[fast]" in rows["w8a8-dynamic"] and "[fast]" in rows["w8a8-smoothquant"]
    default = rows["w8a8-smoothquant-gptq-lntoken"]  # ESM-2's --bits 8
    assert "[accurate]" in default and "[fast]" not in default
    # piecewise-linear activations: several integer GEMMs per site, about float speed on a CPU: neither point
    assert "[accurate]" not in rows["w8a8-pwlq"] and "[fast]" not in rows["w8a8-pwlq"]
    assert "[fast]" not in rows["w8-only"] and "[accurate]" not in rows["w8-only"]
    assert not any(lm_point(cfg) for name, cfg in PRESETS.items() if name.startswith("study-"))
    for name in ("bf16-trunk", "w8a8-pwlq-stem"):  # ESMFold-only: marked so, and no language-model point
        assert "[ESMFold]" in rows[name] and "[accurate]" not in rows[name] and "[fast]" not in rows[name]
    assert "[ESMFold]" not in rows["w8a8-pwlq"]


def test_json_lists_the_registry(capsys):
    got = json.loads(_listed(capsys, "--json"))
    assert [row["name"] for row in got] == list(PRESETS)


def test_quantize_help_points_at_the_list(capsys):
    try:
        main(["quantize", "--help"])
    except SystemExit:
        pass
    assert "ptq-protein presets" in " ".join(capsys.readouterr().out.split())


def test_listing_imports_no_torch():
    code = ("import sys; from ptq_protein.cli.main import main; main(['presets']); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
