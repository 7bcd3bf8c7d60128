"""ESM C through every workload: quantize, embed, score, int8, BOS/EOS rows, sensitivity (tiny-esmc).

References are computed here from the model's own forward, one sequence at a time and one masked position at a
time (fair-esm ``predict.py``'s loop), so the batched, padded workloads are checked against the plain model.
"""

import json
from pathlib import Path

import pytest
import torch

import ptq_protein as pp
from ptq_protein import read_embeddings
from ptq_protein.cli.main import main
from ptq_protein.models.tokens import ESMC_VOCAB, tokenize_esmc
from ptq_protein.workloads.mutants import AMINO_ACIDS

SEQS = {"a": "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "b": "MENDELKKLLAAGHRW", "c": "ACDEFGHIKLMNPQRSTVWYACDEFGHIKL"}
PROTEIN = "MKTAYIAKQRQISF"


def cli(*args) -> int:
    try:
        return main([*map(str, args), "--quiet"])
    except SystemExit as stop:
        return stop.code


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("esmc") / "w8a8"
    assert cli("quantize", "tiny-esmc", "--preset", "w8a8-pwlq", "--calib", "casp14:4", "--compare", "none",
               "--check", "1", "--out", out) == 0
    return out


def _direct(model, sequence: str, layers=(0, 1, 2, 3)):
    """One sequence alone through the model's own forward: ({layer: [L, C]}, logits [L, 64]) of its residues."""
    tokens = tokenize_esmc([sequence])[0]
    with torch.no_grad():
        out = model(tokens, repr_layers=layers)
    return {k: v[0, 1:-1] for k, v in out["representations"].items()}, out["logits"][0, 1:-1]


@pytest.mark.parametrize("fmt", ["pt", "h5"])
def test_embed_equals_each_sequence_alone(tmp_path, artifact, fmt):
    if fmt == "h5":
        pytest.importorskip("h5py")
    fasta = tmp_path / "s.fasta"
    fasta.write_text("".join(f">{k}\n{v}\n" for k, v in SEQS.items()))
    out = tmp_path / "emb"
    assert cli("embed", artifact, fasta, "--out", out, "--include", "mean", "per_tok", "bos", "logits",
               "--repr-layers", "0", "1", "2", "-1", "--format", fmt) == 0
    got = read_embeddings(out)
    model = pp.load(artifact)
    for label, seq in SEQS.items():
        reps, logits = _direct(model, seq)
        entry = got[label]
        assert sorted(entry["representations"]) == [0, 1, 2, 3]  # block 2 and the final LayerNorm: two keys
        for layer in (0, 1, 2, 3):
            torch.testing.assert_close(entry["representations"][layer], reps[layer], atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(entry["mean_representations"][layer], reps[layer].mean(0), atol=2e-5,
                                       rtol=1e-5)
        torch.testing.assert_close(entry["logits"], logits, atol=2e-5, rtol=1e-5)
        assert entry["bos_representations"][3].shape == (64,)


def test_a_rotated_artifact_quantizes_and_embeds_from_the_cli(tmp_path):
    """w8a8-rotate (online Hadamard on the SwiGLU product) through the commands: the embeddings are those of the
    loaded artifact run on each sequence alone, and the artifact rebuilds the rotation."""
    art, fasta, out = tmp_path / "rot", tmp_path / "s.fasta", tmp_path / "emb"
    assert cli("quantize", "tiny-esmc", "--preset", "w8a8-rotate", "--compare", "none", "--check", "1",
               "--out", art) == 0
    fasta.write_text("".join(f">{k}\n{v}\n" for k, v in SEQS.items()))
    assert cli("embed", art, fasta, "--out", out, "--include", "per_tok", "--repr-layers", "-1") == 0
    model = pp.load(art)
    assert model.ffn_rotation == 128
    got = read_embeddings(out)
    for label, seq in SEQS.items():
        torch.testing.assert_close(got[label]["representations"][3], _direct(model, seq, (3,))[0][3],
                                   atol=2e-5, rtol=1e-5)


def test_embed_refuses_contacts_in_one_line(tmp_path, artifact, capsys):
    fasta = tmp_path / "s.fasta"
    fasta.write_text(">a\nMKTAYIAK\n")
    assert cli("embed", artifact, fasta, "--out", tmp_path / "e", "--include", "contacts") == 2
    err = capsys.readouterr().err.strip()
    assert "no contact head" in err and "\n" not in err and not (tmp_path / "e" / "a.pt").exists()


def _predict_loop(model, sequence: str) -> torch.Tensor:
    """predict.py's masked-marginals: mask residue i alone, log-softmax of all logits there; grid [L, 20]."""
    tokens = tokenize_esmc([sequence])[0]
    ids = torch.tensor([ESMC_VOCAB.index(a) for a in AMINO_ACIDS])
    rows = []
    for i, wt in enumerate(sequence):
        masked = tokens.clone()
        masked[0, i + 1] = ESMC_VOCAB.index("<mask>")
        with torch.no_grad():
            log_probs = torch.log_softmax(model(masked)["logits"][0, i + 1], dim=-1)
        rows.append(log_probs[ids] - log_probs[ESMC_VOCAB.index(wt)])
    return torch.stack(rows)


def test_score_masked_marginals_equals_predict_loop(tmp_path, artifact):
    import csv

    out = tmp_path / "singles.csv"
    assert cli("score", artifact, "--sequence", PROTEIN, "--out", out, "--score-col", "s") == 0
    with open(out, newline="") as handle:
        rows = list(csv.reader(handle))[1:]
    assert len(rows) == 19 * len(PROTEIN)
    want = _predict_loop(pp.load(artifact), PROTEIN)
    got = {r[0]: float(r[1]) for r in rows}
    for i, wt in enumerate(PROTEIN):
        for a, mt in enumerate(AMINO_ACIDS):
            if mt != wt:
                assert got[f"{wt}{i + 1}{mt}"] == pytest.approx(float(want[i, a]), abs=2e-5)


@pytest.mark.parametrize("strategy", ["wt-marginals", "pseudo-ppl"])
def test_other_strategies_run_on_esmc(tmp_path, strategy):
    out = tmp_path / "s.csv"
    assert cli("score", "tiny-esmc", "--sequence", PROTEIN[:6], "--strategy", strategy, "--out", out) == 0
    assert len(out.read_text().splitlines()) == 1 + 19 * 6


@pytest.mark.parametrize("recipe", ["w8a8-uniform", "w8a8-dynamic"])
def test_int8_backend_matches_fake_and_reloads_bit_for_bit(tmp_path, esmc, seqs, recipe):
    tokens = tokenize_esmc(seqs)[0]
    fake = pp.quantize(esmc, recipe, calibration=seqs)
    integer = pp.quantize(esmc, recipe, calibration=seqs, backend="int8")
    pp.save(integer, tmp_path / "a")
    again = pp.load(tmp_path / "a")
    with torch.no_grad():
        want, got, reloaded = (m(tokens)["logits"] for m in (fake, integer, again))
    assert torch.equal(got, reloaded)
    keep = tokens != 1
    assert ((got - want)[keep].norm() / want[keep].norm()).item() < 1e-4


def test_bos_eos_rows_pass_every_quantizer_unchanged(esmc, seqs):
    from ptq_protein.nn.modules import ActQuantizer

    qmodel = pp.quantize(esmc, "w8a8-uniform", calibration=seqs)
    quants = [m for m in qmodel.modules() if isinstance(m, ActQuantizer)]
    assert quants and all(q.special_tokens is not None for q in quants)
    tokens = tokenize_esmc(seqs)[0]
    special = (tokens == 0) | (tokens == 2)
    seen = []
    hooks = [q.register_forward_hook(lambda m, a, out: seen.append((a[0], out))) for q in quants]
    with torch.no_grad():
        qmodel(tokens)
    for hook in hooks:
        hook.remove()
    assert len(seen) == len(quants)
    for x, y in seen:
        assert torch.equal(x[special], y[special])
    assert any(not torch.equal(x[~special & (tokens != 1)], y[~special & (tokens != 1)]) for x, y in seen)


def test_sites_and_smoothing_pairs_are_the_issue_s(esmc):
    from ptq_protein.calibration.sites import discover_sites
    from ptq_protein.models.adapters import get_adapter

    adapter = get_adapter(esmc)
    names = {s.name: s for s in discover_sites(esmc, adapter)}
    block = "transformer.blocks.0."
    for linear in ("attn.layernorm_qkv.1", "attn.out_proj", "ffn.1", "ffn.3"):  # QKV, attention out, SwiGLU in/out
        assert names[block + linear].kind.value == "linear" and not names[block + linear].is_head
    assert names[block + "attn.layernorm_qkv.0"].kind.value == "layernorm"
    assert names[block + "attn"].kind.value == "matmul"
    assert names["sequence_head.0"].is_head and names["sequence_head.3"].is_head
    assert adapter.smoothing_pairs(esmc)[:2] == [(block + "attn.layernorm_qkv.0", (block + "attn.layernorm_qkv.1",)),
                                                 (block + "ffn.0", (block + "ffn.1",))]


def test_sensitivity_and_auto_run_on_esmc(esmc, seqs):
    from ptq_protein.search.sensitivity import sensitivity

    table = sensitivity(esmc, "w8a8-pwlq", seqs[:2], calibration=seqs, unit="layer")
    assert {row["unit"] for row in table["rows"]} >= {"transformer.blocks.0", "transformer.blocks.1"}
    assert all(row["metric"] == "logits_rel" and row["loss"] > 0 for row in table["rows"])
    qmodel = pp.quantize(esmc, "auto", calibration=seqs, budget="logits_rel<=0.05", search_set=seqs[:2],
                         holdout=seqs[2:4])
    assert qmodel.ptq_state.plan is not None


def test_eval_variants_measures_drift_on_esmc(tmp_path, esmc):
    import csv

    import numpy as np
    from scipy.stats import spearmanr

    from ptq_protein.data.sets import BenchmarkSet, Target
    from ptq_protein.eval.bench.runner import RunOptions
    from ptq_protein.eval.bench.variants_task import VariantOptions, evaluate_variants

    bench = BenchmarkSet("t", (Target("p", PROTEIN),))
    result = evaluate_variants(esmc, bench, ["fp", "w8a8-pwlq"], tmp_path, RunOptions(calibration=list(SEQS.values())),
                               VariantOptions(), {})
    with open(result["results"], newline="") as handle:
        rows = {r["recipe"]: r for r in csv.DictReader(handle)}
    assert result["counts"]["ok"] == 2 and float(rows["fp"]["spearman_vs_fp"]) == 1.0
    fp, q = (np.load(tmp_path / rows[r]["variants"]) for r in ("fp", "w8a8-pwlq"))
    changed = np.array([[aa != wt for aa in AMINO_ACIDS] for wt in PROTEIN])
    drift = float(rows["w8a8-pwlq"]["spearman_vs_fp"])
    assert 0.99 < drift < 1.0 and drift == pytest.approx(spearmanr(q[changed], fp[changed])[0], abs=1e-6)


def test_every_block_and_the_final_norm_are_layers_of_their_own(tmp_path, artifact, capsys):
    """ESM C: 1..n the blocks' own outputs, n + 1 (= -1) the final LayerNorm's; a layer past it is refused naming
    what the numbers are."""
    fasta = tmp_path / "s.fasta"
    fasta.write_text(">a\nMKTAYIAKQR\n")
    assert cli("embed", artifact, fasta, "--out", tmp_path / "e", "--include", "per_tok",
               "--repr-layers", "2", "-1") == 0
    reps = read_embeddings(tmp_path / "e")["a"]["representations"]
    model = pp.load(artifact)
    with torch.no_grad():
        out = model(tokenize_esmc(["MKTAYIAKQR"])[0], repr_layers=[2])
    assert sorted(reps) == [2, 3]
    torch.testing.assert_close(reps[3], out["embeddings"][0, 1:-1], atol=2e-5, rtol=1e-5)
    assert not torch.allclose(reps[2], reps[3], atol=1e-3)  # block 2's own output is not the LayerNorm's
    assert cli("embed", artifact, fasta, "--out", tmp_path / "f", "--repr-layers", "4") == 2
    assert "final LayerNorm" in capsys.readouterr().err
    identity = json.loads((tmp_path / "e" / "embed_run.json").read_text())
    assert "final LayerNorm" in identity["model"]["repr_layers"]  # a folder of the older numbering is refused
