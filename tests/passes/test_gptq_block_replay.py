"""Sequential GPTQ that replays finished blocks gives the codes of the plain sequential pass, with fewer block runs."""

import copy

import pytest
import torch

from ptq_protein.calibration.block_replay import block_plan
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.tiny import tiny_esmc
from ptq_protein.recipes.presets import get_preset
from ptq_protein.transforms.gptq_pass import gptq_model_

SEQS = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDELKKLLAAGHRW", "MKKLLPTAAAGLLLLAAQPAMA"]


def _gptq(model, replay: bool):
    """(codes by site, Linear calls run) of sequential GPTQ over every Linear of the model's blocks."""
    model = copy.deepcopy(model)
    adapter = get_adapter(model)
    adapter.prepare(model)
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and adapter_site(n)]
    runs = []
    handles = [m.register_forward_pre_hook(lambda *a: runs.append(1)) for m in model.modules()
               if isinstance(m, torch.nn.Linear)]  # a replayed block runs none of its Linears
    cfg = get_preset("w8a8-gptq-pwlq")
    try:
        codes = gptq_model_(model, adapter, names, cfg.weights, cfg.gptq, SEQS, batch_size=2, replay_blocks=replay)
    finally:
        for h in handles:
            h.remove()
    return {n: c["weight_codes"] for n, c in codes.items()}, len(runs)


def adapter_site(name: str) -> bool:
    """A Linear inside the encoder stack (heads and contact regression stay out, as the presets leave them)."""
    return any(part in name for part in ("layers.", "encoder.layer.", "transformer.blocks.")) and "head" not in name


@pytest.mark.parametrize("which", ["esm2", "hf_esm2", "esmc"])
def test_replayed_blocks_give_the_plain_passes_codes(which, request):
    model = tiny_esmc(0, num_layers=4, d_model=64, heads=4)[0] if which == "esmc" else request.getfixturevalue(which)
    plain, plain_runs = _gptq(model, replay=False)
    replayed, replayed_runs = _gptq(model, replay=True)
    assert plain.keys() == replayed.keys() and len(plain) >= 8
    assert all(torch.equal(plain[n], replayed[n]) for n in plain)
    assert replayed_runs < plain_runs  # the finished blocks were not rerun


def test_a_block_called_twice_or_a_site_outside_the_blocks_keeps_the_plain_pass():
    groups = [("layers.0.fc1",), ("layers.1.fc1",)]
    assert block_plan(groups, ["layers.0", "layers.1"]) is not None
    assert block_plan(groups, ["layers.0", "layers.1", "layers.0", "layers.1"]) is None  # recycled
    assert block_plan(groups, ["layers.1", "layers.0"]) is None  # out of order
    assert block_plan([("layers.0.fc1",), ("head.dense",)], ["layers.0"]) is None  # a site outside
    assert block_plan([("layers.1.fc1",), ("layers.0.fc1",)], ["layers.0", "layers.1"]) is None  # groups unordered


def test_esmfold_keeps_the_plain_pass(esmfold):
    """ESMFold's trunk runs its blocks once per recycle (and its sites span several stacks): no replay."""
    from ptq_protein.calibration.hessian import block_replay, linear_call_groups

    adapter = get_adapter(esmfold)
    model = copy.deepcopy(esmfold)
    adapter.prepare(model)
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    batch = next(iter(adapter.batches(SEQS[:1], None)))
    groups = linear_call_groups(model, adapter, names, batch)
    assert block_replay(model, adapter, groups, batch) is None
