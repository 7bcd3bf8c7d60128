"""The study's W8 on tiny ESMFold: its two key filters, the float32 cast of the stem, the rotary buffer.

References are the study-shaped re-implementation (``study_reference.py``) and
closed forms; the key filters are the literal prefixes of their code
(``quant_weis.py:38`` and ``quant_weis_exp2.ipynb#cell6``).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import ptq_protein as pp
from ptq_protein.quant.study import study_weight_rows
from ptq_protein.recipes.config import StudyOptions
from tests.quant.study_reference import ref_uniform, ref_w8_state

SCRIPTS = ("esm.encoder.layer", "trunk.block", "trunk.structure_module")  # quant_weis.py:38, quant_full.py:33
NOTEBOOK = ("esm.encoder.", "trunk.block")  # quant_weis_exp2.ipynb#cell6, quant_exp_combine_v1.ipynb#cell11


@pytest.fixture(scope="module")
def esmfold():
    from ptq_protein.models.tiny import tiny_esmfold

    return tiny_esmfold()[0]


def _keys(model, prefixes):
    return [k for k, v in model.state_dict().items()
            if k.startswith(prefixes) and v.is_floating_point() and not k.endswith("inv_freq")]


@pytest.mark.parametrize("preset,prefixes", [("study-w8", SCRIPTS), ("study-w8-notebook", NOTEBOOK)])
def test_each_w8_rounds_the_keys_of_its_source(esmfold, preset, prefixes):
    before = {k: v.clone() for k, v in esmfold.state_dict().items()}
    q = pp.quantize(esmfold, preset)
    keys = _keys(esmfold, prefixes)
    assert sorted(k for k in q.ptq_state.quantized) == sorted(keys)
    expected = ref_w8_state(before, keys)
    for key, value in q.state_dict().items():
        assert torch.equal(value, expected[key]), key


def test_the_two_filters_differ_where_their_sources_do(esmfold):
    scripts, notebook = set(_keys(esmfold, SCRIPTS)), set(_keys(esmfold, NOTEBOOK))
    assert {k.split(".")[1] for k in scripts - notebook} == {"structure_module"}
    assert notebook - scripts == {k for k in notebook if k.startswith("esm.encoder.emb_layer_norm_after")}


def test_w8_casts_a_half_stem_to_float32_before_rounding(esmfold):
    """quant_weis.py:29 (model.esm = model.esm.float()) on every device: here a float16 stem on CPU."""
    half = copy.deepcopy(esmfold)
    half.esm.half()
    q = pp.quantize(half, "study-w8")
    assert all(t.dtype == torch.float32 for t in q.esm.state_dict().values() if t.is_floating_point())
    keys = _keys(half, SCRIPTS)
    as_float = {k: (v.float() if v.is_floating_point() else v) for k, v in half.state_dict().items()}
    expected = ref_w8_state(as_float, keys)
    stem = [k for k in keys if k.startswith("esm.")]
    for key in stem:
        assert torch.equal(q.state_dict()[key], expected[key]), key
    # Without the cast the same rows are rounded in float16: the values differ (the codes on some rows too).
    no_cast = pp.get_preset("study-w8").replace(study=StudyOptions(weight_prefixes=SCRIPTS))
    q16 = pp.quantize(half, no_cast)
    assert q16.esm.encoder.layer[0].attention.self.query.weight.dtype == torch.float16
    as_half = ref_w8_state(half.state_dict(), stem)
    assert all(torch.equal(q16.state_dict()[k], as_half[k]) for k in stem)
    assert any(not torch.equal(q16.state_dict()[k].float(), q.state_dict()[k]) for k in stem)


def test_round_rotary_rounds_the_buffer_wherever_the_library_keeps_it(esmfold):
    name = next(n for n, _ in esmfold.named_buffers() if n.endswith("inv_freq"))
    before = esmfold.get_buffer(name).clone()
    for round_rotary in (False, True):
        cfg = pp.get_preset("study-w8").replace(study=StudyOptions(weight_prefixes=NOTEBOOK, round_rotary=round_rotary))
        after = pp.quantize(esmfold, cfg).get_buffer(name)
        if not round_rotary:
            assert torch.equal(after, before)
            continue
        top = before.abs().max()
        assert torch.equal(after, ref_uniform(before, 8, -top, top)) and not torch.equal(after, before)
        assert int((after == 0).sum()) == int((before < top / 255).sum())  # below half a step: 0


def test_their_rounding_zeroes_12_of_32_frequencies_at_head_size_64():
    """The closed form behind "12 of 32": 10000^(-i/32) < 1/255 for i >= 20."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.float) / 64))
    zeros = int((study_weight_rows(inv_freq) == 0).sum())
    assert zeros == 32 - math.ceil(32 * math.log(255) / math.log(10000)) == 12
