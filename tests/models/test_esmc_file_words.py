"""ESM C files and models told the right words: an int64 weight names the dtype (torch's text said the shapes
match), a file in ESM C's layout lacking a key is not "not a fair-esm checkpoint", and an ESM C model is not told
"ESM-2 accepts at most 1022 residues"."""

import pytest
import torch

from ptq_protein.cli.main import main
from ptq_protein.models.esmc import ESMC


@pytest.fixture()
def fasta(tmp_path):
    path = tmp_path / "x.fasta"
    path.write_text(">a\nMKTAYIAK\n")
    return path


def _embed(path, fasta, out, capsys):
    code = main(["embed", str(path), str(fasta), "--out", str(out), "--quiet"])
    return code, capsys.readouterr().err.strip()


def test_an_int64_weight_is_named_with_its_dtype(tmp_path, fasta, capsys):
    state = ESMC(128, 2, 2).state_dict()
    state["transformer.blocks.1.ffn.3.weight"] = state["transformer.blocks.1.ffn.3.weight"].long()
    torch.save(state, tmp_path / "esmc_small.pth")
    code, err = _embed(tmp_path / "esmc_small.pth", fasta, tmp_path / "o", capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert "integer where a float weight belongs (1): ['transformer.blocks.1.ffn.3.weight int64']" in err
    assert "dimensions" not in err and "config" not in err and "not an ESM C checkpoint: re-download it" in err


@pytest.mark.parametrize("key", ["embed.weight", "transformer.blocks.0.attn.layernorm_qkv.1.weight"])
def test_an_esmc_layout_without_a_key_is_called_esmc(tmp_path, fasta, capsys, key):
    state = ESMC(128, 2, 2).state_dict()
    del state[key]
    torch.save(state, tmp_path / "esmc_small.pth")
    code, err = _embed(tmp_path / "esmc_small.pth", fasta, tmp_path / "o", capsys)
    assert code == 2 and f"an ESM C state dict (transformer.blocks.* keys) without the tensor(s) ['{key}']" in err
    assert "fair-esm" not in err


def test_score_does_not_call_an_esmc_limit_esm2s(tmp_path, capsys):
    code = main(["score", "tiny-esmc", "--sequence", "M" * 1100, "--out", str(tmp_path / "s.csv"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "longer than the limit of 1022" in err and "ESM-2 accepts" not in err
    assert "whatever the model" in err


@pytest.mark.parametrize("key", ["model", "state_dict"])
def test_an_esmc_state_dict_nested_under_a_key_is_called_esmc(tmp_path, fasta, capsys, key):
    torch.save({key: ESMC(128, 2, 2).state_dict()}, tmp_path / "esmc_small.pth")
    code, err = _embed(tmp_path / "esmc_small.pth", fasta, tmp_path / "o", capsys)
    assert code == 2 and f"an ESM C state dict nested under '{key}'" in err and "fair-esm" not in err
