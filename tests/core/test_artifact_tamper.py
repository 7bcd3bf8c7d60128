"""Fuzz-style: tamper every field of a real recipe.json; each tampered artifact must be refused.

For every node of the recipe (every scale, zero point, codebook entry, bit width,
name, flag, checksum ...): a deletion, and one change (a scale edit x1.5, NaN or
a type change, rotating). Each edited artifact must be refused by ``pp.load`` with an
``ArtifactError`` whose message is one line naming recipe.json and the field.
On the old code (recipe.json not sealed) most of these loaded silently.
"""

import json
import math
import shutil

import pytest
import torch

import ptq_protein as pp
from ptq_protein.support.errors import ArtifactError


@pytest.fixture(scope="module")
def artifact(esm2, tmp_path_factory):
    seqs = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDELKKLLAAGHRW", "GSHMLEDPVAGVSKEELLKLAEEAR"]
    q = pp.quantize(esm2, "w8a8-pwlq", calibration=seqs)
    path = tmp_path_factory.mktemp("tamper") / "art"
    pp.save(q, path)
    return path


def _walk(obj, path=()):
    """(path, value) for every node below the top, leaves and containers."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        yield path + (key,), value
        yield from _walk(value, path + (key,))


def _mutations(value):
    if isinstance(value, bool):
        return [("flip", not value), ("type", str(value).lower())]
    if isinstance(value, (int, float)):
        scaled = value * 1.5 if value else 1
        return [("scale", scaled), ("nan", math.nan), ("type", str(value))]
    if isinstance(value, str):
        return [("edit", value + "x"), ("type", 1)]
    if value is None:
        return [("type", 0)]
    return [("type", "x")]  # a list or an object replaced by a string


def _set(recipe, path, value):
    node = recipe
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        if isinstance(node, dict):
            del node[path[-1]]
        else:
            node.pop(path[-1])
    else:
        node[path[-1]] = value


_DELETE = object()


def _cases(recipe):
    """Every node deleted, and every node changed once; the kind of change (scale, NaN, type) rotates
    along the nodes so every kind reaches every part of the recipe while the test stays short."""
    for i, (path, value) in enumerate(_walk(recipe)):
        options = _mutations(value)
        yield (path, *options[i % len(options)])
        yield path, "delete", _DELETE


def _field(path):
    return "/".join(str(p) for p in path)


def test_every_tampered_field_is_refused_naming_it(artifact, tmp_path):
    original = json.loads((artifact / "recipe.json").read_text())
    work = tmp_path / "art"
    shutil.copytree(artifact, work)
    pp.load(work)  # the untouched copy loads
    cases = list(_cases(original))
    assert len(cases) > 500, "the fuzz must reach the quantizer parameters"
    assert any("scale" in _field(p) for p, _, _ in cases) and any("codebook" in _field(p) for p, _, _ in cases)
    failures = []
    for path, name, new in cases:
        recipe = json.loads(json.dumps(original))
        _set(recipe, path, new)
        if path[-1] == "format_version" and name != "delete":
            continue  # checked below: a version change is refused as a version, not as a field
        if isinstance(path[-1], int) and name == "delete":
            shown = path[:-1]  # deleting a list element changes the list's length
        else:
            shown = path
        (work / "recipe.json").write_text(json.dumps(recipe, indent=2))
        try:
            pp.load(work)
        except ArtifactError as err:
            text = str(err)
            if "\n" in text or "recipe.json" not in text or _field(shown) not in text:
                failures.append(f"{name} {_field(path)}: message {text!r}")
            continue
        failures.append(f"{name} {_field(path)}: loaded")
    assert not failures, f"{len(failures)}/{len(cases)} tampered recipes not refused properly: {failures[:5]}"


@pytest.mark.parametrize("text, words", [
    ("[1, 2]", "JSON object"), ("3", "JSON object"), ("{not json", "not valid JSON"),
    ('{"format": "ptq-protein-artifact", "format_version": 1}', "re-run quantize"),
    ('{"format": "ptq-protein-artifact", "format_version": 2}', "seal does not cover the tensors"),
    ('{"format": "ptq-protein-artifact", "format_version": 3}', "files"),
    ('{"format": "other", "format_version": 3}', "field format"),
])
def test_malformed_recipes_are_refused_in_one_line(artifact, tmp_path, text, words):
    work = tmp_path / "art"
    shutil.copytree(artifact, work)
    (work / "recipe.json").write_text(text)
    with pytest.raises(ArtifactError) as err:
        pp.load(work)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_scale_edit_of_the_issue_is_refused_through_the_cli(artifact, tmp_path, capsys):
    """The issue's case: a 1.5x activation scale edit changed logits by 28.75 and loaded with rc 0."""
    from ptq_protein.cli.main import main

    work = tmp_path / "art"
    shutil.copytree(artifact, work)
    recipe = json.loads((work / "recipe.json").read_text())
    site, entry = next((n, e) for n, e in recipe["sites"].items() if "codebook" in e.get("input_quant", {}))
    book = entry["input_quant"]["codebook"]
    book["scale"] = [s * 1.5 for s in book["scale"]]
    (work / "recipe.json").write_text(json.dumps(recipe))
    fasta = tmp_path / "x.fasta"
    fasta.write_text(">a\nMKTAYIAK\n")
    assert main(["fold", str(work), "--fasta", str(fasta), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"sites/{site}/input_quant/codebook/scale" in err


def test_edited_report_and_tensor_header_are_refused(artifact, tmp_path):
    work = tmp_path / "art"
    shutil.copytree(artifact, work)
    (work / "report.md").write_text("edited")
    with pytest.raises(ArtifactError, match="report.md"):
        pp.load(work)


def test_load_refuses_unknown_backend_and_missing_cuda(artifact):
    with pytest.raises(ValueError, match="fake"):
        pp.load(artifact, backend="int9")
    if torch.cuda.device_count() < 8:
        with pytest.raises(ValueError, match="not available"):
            pp.load(artifact, device="cuda:7")
