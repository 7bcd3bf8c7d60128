"""ESM C: ptq-protein's model against EvolutionaryScale's own class, its tokenizer, and its files.

The reference outputs come from the official ``ESMC`` class run in its own virtual environment by
``scripts/esmc_reference.py`` (see ``data/esmc_reference/README.md``); the checkpoint it ran is rebuilt here
from the recorded seed, and its digest checked, so the comparison is on the same weights.
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.overrides import TorchFunctionMode

from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.esmc import ESMC
from ptq_protein.models.lm_outputs import lm_tokens
from ptq_protein.models.loading import ModelFamily, load_model, locate_weights
from ptq_protein.models.tokens import ESMC_VOCAB, esm_vocab, tokenize_esmc
from ptq_protein.support.errors import InputError, MissingWeightsError

DATA = Path(__file__).parent / "data" / "esmc_reference"
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "esmc_reference.py"
TOLERANCE = 1e-5  # the goal: FP outputs equal the official class's within 1e-5


def _reference_script():
    spec = importlib.util.spec_from_file_location("esmc_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference():
    info = json.loads((DATA / "reference.json").read_text())
    return info, load_file(str(DATA / "outputs.safetensors"))


@pytest.fixture(scope="module")
def ours(reference):
    """Our ESMC holding the checkpoint the official class ran (rebuilt from the seed; digest checked)."""
    info, _ = reference
    script = _reference_script()
    model = ESMC(**info["config"]).eval()
    state = script.random_state_dict({k: v.shape for k, v in model.state_dict().items()}, info["seed"])
    assert script.state_sha256(state) == info["state_sha256"], "the rebuilt checkpoint is not the one the fixture ran"
    model.load_state_dict(state, strict=True)
    return model


def _run(model, tokens):
    """(logits, embeddings, every block's output stacked [n_layers, B, T, C]) of our model."""
    blocks = []
    hooks = [b.register_forward_hook(lambda m, a, out: blocks.append(out)) for b in model.transformer.blocks]
    try:
        with torch.no_grad():
            out = model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return out["logits"], out["embeddings"], torch.stack(blocks)


class _AnyMode(TorchFunctionMode):
    """A torch function mode (as the MATMUL-site interceptor is): the attention takes its explicit path."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("path", ["sdpa", "explicit"])
def test_outputs_equal_the_official_class_within_1e_5(reference, ours, path):
    info, want = reference
    if path == "explicit":
        with _AnyMode():
            got = _run(ours, want["input"])
    else:
        got = _run(ours, want["input"])
    for name, value in zip(("sequence_logits", "embeddings", "hidden_states"), got):
        assert value.shape == want[name].shape, name
        torch.testing.assert_close(value, want[name], rtol=0, atol=TOLERANCE, msg=name)
    assert (want["input"] == 1).any(), "the fixture batch has padding (its rows are compared too)"


def test_representations_reach_every_block_and_the_final_norm(reference, ours):
    """0 the embedding, i in 1..n block i's own output (the official hidden_states[i - 1], the last block's
    included), n + 1 the final LayerNorm's (the official embeddings)."""
    info, want = reference
    n = info["config"]["n_layers"]
    with torch.no_grad():
        reps = ours(want["input"], repr_layers=range(n + 2))["representations"]
    assert sorted(reps) == list(range(n + 2)) and ours.final_norm_layer == n + 1
    torch.testing.assert_close(reps[0], ours.embed(want["input"]))
    for i in range(1, n + 1):
        torch.testing.assert_close(reps[i], want["hidden_states"][i - 1], rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(reps[n + 1], want["embeddings"], rtol=0, atol=TOLERANCE)  # after the final LayerNorm


def test_tokenizers_give_the_official_ids(reference):
    info, want = reference
    assert list(ESMC_VOCAB) == info["vocab"]
    # ESM-2's alphabet agrees on every id but 31 (ESM C's chain break), so ESM-2's batch layout feeds ESM C
    assert [i for i, (a, b) in enumerate(zip(esm_vocab(), ESMC_VOCAB)) if a != b] == [31]
    tokens, mask = tokenize_esmc(info["sequences"])
    assert torch.equal(tokens, want["tokens"]) and torch.equal(mask, want["tokens"] != 1)
    assert torch.equal(lm_tokens(info["sequences"]), want["tokens"])
    batch = get_adapter(ESMC(32, 2, 1)).make_batch(info["sequences"])
    assert torch.equal(batch.inputs["sequence_tokens"], want["tokens"])


def _random_file(path, d_model=128, n_layers=2, dtype=torch.float32, seed=3):
    script = _reference_script()
    shapes = {k: v.shape for k, v in ESMC(d_model, d_model // 64, n_layers).state_dict().items()}
    state = {k: v.to(dtype) for k, v in script.random_state_dict(shapes, seed).items()}
    torch.save(state, path)  # the official layout: a bare state dict
    return state


def test_a_file_in_the_official_layout_loads_as_esmc(tmp_path):
    state = _random_file(tmp_path / "esmc_small.pth")
    loaded = load_model(tmp_path / "esmc_small.pth")
    assert loaded.family is ModelFamily.ESMC and isinstance(loaded.model, ESMC)
    assert (loaded.model.d_model, loaded.model.n_heads, loaded.model.num_layers) == (128, 2, 2)
    direct = ESMC(128, 2, 2).eval()
    direct.load_state_dict(state)
    tokens = lm_tokens(["MKTAYIAKQRQ", "MENDEL"])
    with torch.no_grad():
        assert torch.equal(loaded.model(tokens)["logits"], direct(tokens)["logits"])
    assert torch.equal(loaded.tokenize(["MKTAYIAKQRQ", "MENDEL"])[0], tokens)


def test_a_bfloat16_file_loads_in_the_dtype_asked_for(tmp_path):
    _random_file(tmp_path / "half.pth", dtype=torch.bfloat16)
    assert {p.dtype for p in load_model(tmp_path / "half.pth").model.parameters()} == {torch.float32}
    low = load_model(tmp_path / "half.pth", dtype=torch.bfloat16).model
    assert {p.dtype for p in low.parameters()} == {torch.bfloat16}


def test_missing_weights_name_every_place_searched(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    with pytest.raises(MissingWeightsError) as err:
        load_model("esmc_600m")
    message = str(err.value)
    assert "\n" not in message and "esmc_600m_2024_12_v0.pth" in message and "nothing is downloaded" in message
    assert str(tmp_path / "torch" / "hub" / "checkpoints") in message
    assert "models--EvolutionaryScale--esmc-600m-2024-12" in message and "--weights PATH" in message


def test_names_find_the_torch_hub_file_then_the_official_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    repo = tmp_path / "hf" / "hub" / "models--EvolutionaryScale--esmc-300m-2024-12"
    cached = repo / "snapshots" / "abc123" / "data" / "weights" / "esmc_300m_2024_12_v0.pth"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"x")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    assert locate_weights("esmc_300m") == cached
    assert locate_weights("EvolutionaryScale/esmc-300m-2024-12") == cached
    hub = tmp_path / "torch" / "hub" / "checkpoints" / "esmc_300m_2024_12_v0.pth"
    hub.parent.mkdir(parents=True)
    hub.write_bytes(b"x")
    assert locate_weights("esmc_300m") == hub


def test_a_published_name_on_a_file_of_other_sizes_is_refused(tmp_path):
    _random_file(tmp_path / "small.pth")
    with pytest.raises(InputError, match="esmc_300m is 30 x 960"):
        load_model("esmc_300m", weights=tmp_path / "small.pth")


def test_a_width_without_64_wide_heads_is_refused_in_one_line(tmp_path):
    script = _reference_script()
    shapes = {k: v.shape for k, v in ESMC(96, 3, 1).state_dict().items()}
    torch.save(script.random_state_dict(shapes, 0), tmp_path / "odd.pth")
    with pytest.raises(InputError, match="head count is unknown") as err:
        load_model(tmp_path / "odd.pth")
    assert "\n" not in str(err.value)


def test_a_file_missing_keys_names_them(tmp_path):
    state = _random_file(tmp_path / "x.pth")
    del state["transformer.blocks.1.ffn.3.weight"]
    torch.save(state, tmp_path / "x.pth")
    with pytest.raises(InputError, match=r"missing \(1\).*ffn\.3\.weight"):
        load_model(tmp_path / "x.pth")


def test_evolutionaryscale_class_is_refused_by_name():
    """The official class shares our class name but not our forward: the adapter lookup tells them apart."""
    official = type("ESMC", (torch.nn.Module,), {"__module__": "esm.models.esmc"})()
    with pytest.raises(TypeError, match="ptq_protein.models.esmc.ESMC"):
        get_adapter(official)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_equals_the_rotate_half_formula_bit_for_bit(dtype):
    """The rotary written half by half gives ``x * cos + cat(-x2, x1) * sin`` exactly (the formula of the official
    ``rotate_half``), infinities and NaN included: no rounding differs, so calibrations and digests are unchanged."""
    from ptq_protein.models.esmc import rotary, rotary_tables

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 7, 3, 8, generator=gen) * 50).to(dtype)
    x[0, 1, 0, 2], x[1, 3, 2, 6], x[1, 4, 1, 0] = float("inf"), float("nan"), -float("inf")
    cos, sin = rotary_tables(torch.zeros(2, 7, dtype=torch.long), 8)
    half = x.shape[-1] // 2
    want = x * cos.to(dtype) + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin.to(dtype)
    got = rotary(x, cos, sin)
    assert got.dtype == dtype
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())


def test_a_block_with_unit_scaling_adds_its_branches_unscaled():
    """The 600M model's residue scaling is 1: its branches add as they are (the division by 1 is skipped); the
    300M model's divides (sqrt(30 / 36))."""
    model = ESMC(d_model=64, n_heads=4, n_layers=36).eval()
    assert model.transformer.blocks[0].scaling == 1.0
    branch = torch.randn(3, 5)
    assert model.transformer.blocks[0]._scaled(branch) is branch
    small = ESMC(d_model=64, n_heads=4, n_layers=30).transformer.blocks[0]
    assert torch.equal(small._scaled(branch), branch / (30 / 36) ** 0.5)
