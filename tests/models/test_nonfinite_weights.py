"""A checkpoint holding one NaN or inf weight is refused at load in one line naming the tensor (exit 2): ``embed``
and ``score`` wrote all-NaN outputs (or, with NaN only in the embedding row of O, NaN only for sequences holding
O) with exit 0."""

import pytest
import torch

from ptq_protein.cli.main import main
from ptq_protein.models.esmc import ESMC
from ptq_protein.models.fair_esm2 import save_fair_esm2
from ptq_protein.models.tiny import build_tiny

O_ROW = 24  # fair-esm's alphabet: the token of residue O


@pytest.fixture()
def fasta(tmp_path):
    path = tmp_path / "x.fasta"
    path.write_text(">a\nMKTAYIAK\n>b\nMKOAYIAK\n")
    return path


def _fair_file(tmp_path, value):
    model = build_tiny("tiny-esm2", seed=0)[0]
    with torch.no_grad():
        model.embed_tokens.weight[O_ROW, 3] = value
    return save_fair_esm2(model, tmp_path / "esm2_t6_8M_UR50D.pt")


def _esmc_file(tmp_path, value):
    state = ESMC(128, 2, 2).state_dict()
    state["transformer.blocks.1.ffn.3.weight"][0, 0] = value
    torch.save(state, tmp_path / "esmc_small.pth")
    return tmp_path / "esmc_small.pth"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("make", [_fair_file, _esmc_file])
def test_embed_refuses_a_non_finite_weight(tmp_path, fasta, capsys, make, value):
    path = make(tmp_path, value)
    assert main(["embed", str(path), str(fasta), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "non-finite" in err and path.name in err and ".weight" in err
    assert not list((tmp_path / "o").glob("*.pt"))


def test_score_refuses_a_non_finite_weight(tmp_path, capsys):
    path = _fair_file(tmp_path, float("nan"))
    code = main(["score", str(path), "--sequence", "MKTAYIAK", "--out", str(tmp_path / "s.csv"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "embed_tokens.weight holds 1 non-finite value" in err
    assert not (tmp_path / "s.csv").exists()


def test_finite_weights_whose_float32_sum_overflows_pass_and_one_nan_among_them_is_found():
    from ptq_protein.models.finite import check_finite_weights

    model = torch.nn.Linear(4, 1000)
    with torch.no_grad():
        model.weight.fill_(3e38)  # every value finite; their float32 sum is inf
    check_finite_weights(model, "big.pt")
    with torch.no_grad():
        model.weight[7, 2] = float("nan")
    with pytest.raises(Exception, match="weight holds 1 non-finite value"):
        check_finite_weights(model, "big.pt")
