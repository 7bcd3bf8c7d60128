"""Key mappings fair-esm <-> transformers cover every key of the real modules, both ways."""

import pytest
import torch

from ptq_protein.models import tiny_esm2, tiny_esmfold, tiny_hf_esm2
from ptq_protein.models.esm_keymap import fair_esm2_to_hf, hf_to_fair_esm2
from ptq_protein.models.esmfold_convert import fair_esmfold_to_hf, hf_esmfold_to_fair


def test_esm2_mapping_covers_both_libraries_exactly():
    fair, _ = tiny_esm2(seed=0, num_layers=3)
    hf, _ = tiny_hf_esm2(seed=0, num_layers=3)
    forward = fair_esm2_to_hf(fair.state_dict())
    assert not forward.unknown and not forward.dropped
    assert set(forward.state_dict) == set(hf.state_dict())
    backward = hf_to_fair_esm2(hf.state_dict())
    assert not backward.unknown and not backward.dropped
    assert set(backward.state_dict) == set(fair.state_dict())
    for key, value in fair.state_dict().items():
        assert torch.equal(backward.state_dict[key], value), key


def test_esm2_mapping_reports_unknown_and_inconsistent_keys():
    fair, _ = tiny_esm2(seed=0)
    state = dict(fair.state_dict(), **{"layers.0.adapter.weight": torch.zeros(1)})
    assert fair_esm2_to_hf(state).unknown == ("layers.0.adapter.weight",)
    state = dict(fair.state_dict())
    state["layers.1.self_attn.rot_emb.inv_freq"] = state["layers.1.self_attn.rot_emb.inv_freq"] * 2
    with pytest.raises(ValueError, match="inconsistent"):
        fair_esm2_to_hf(state)
    per_layer = fair_esm2_to_hf(fair.state_dict(), rotary_per_layer=True).state_dict
    assert "esm.encoder.layer.1.attention.self.rotary_embeddings.inv_freq" in per_layer
    assert set(hf_to_fair_esm2(per_layer).state_dict) == set(fair.state_dict())


def test_esmfold_mapping_round_trips_every_key():
    model, _ = tiny_esmfold(seed=0)
    hf_state = model.state_dict()
    fair = hf_esmfold_to_fair(hf_state)
    assert not fair.unknown and not fair.dropped
    # the stem carries fair-esm ESM2 names; everything else keeps its (shared) name
    esm2, _ = tiny_esm2(seed=0, num_layers=2, embed_dim=32, heads=4)
    stem_names = {k[len("esm."):] for k in fair.state_dict if k.startswith("esm.")}
    assert stem_names == {k for k in esm2.state_dict() if not k.startswith("lm_head.")}
    assert {k for k in fair.state_dict if not k.startswith("esm.")} == {k for k in hf_state if not k.startswith("esm.")}
    back = fair_esmfold_to_hf(dict(fair.state_dict, **{"esm.lm_head.dense.weight": torch.zeros(32, 32)}))
    assert back.dropped == ("esm.lm_head.dense.weight",) and not back.unknown
    assert set(back.state_dict) == set(hf_state)
    for key, value in hf_state.items():
        assert torch.equal(back.state_dict[key], value), key
