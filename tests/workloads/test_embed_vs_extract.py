"""``embed`` against fair-esm's own ``scripts/extract.py`` loop, run here (FastaBatchedDataset + batch converter).

The reference is fair-esm's code path end to end: its FASTA reader (labels = whole
header lines), its batching, its tokenizer and truncation, the model's own
``repr_layers`` / ``return_contacts`` forward, and extract.py's slicing. Ours must
write the same ``LABEL.pt`` files within 1e-4.
"""

from pathlib import Path

import pytest
import torch

from ptq_protein.cli.main import main
from ptq_protein.workloads.embed import EmbedOptions
from ptq_protein.workloads.embed_run import EmbedRun, fasta_labels

esm = pytest.importorskip("esm")

FASTA = """>a first protein
MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ
>b
MENDELKKLLAAGHRW
>c|x y
ACDEFGHIKLMNPQRSTVWYACDEFGHIKL
>d
GSHMLEDPVAGVSKEELLKLAEEARMSTNPKPQRKTKRNTNRRPQDVKFPGG
"""


def extract_py(model, alphabet, fasta: Path, repr_layers, include, toks_per_batch, truncation):
    """fair-esm's scripts/extract.py main loop, with its own classes (outputs kept in a dict, not files)."""
    dataset = esm.FastaBatchedDataset.from_file(str(fasta))
    batches = dataset.get_batch_indices(toks_per_batch, extra_toks_per_seq=1)
    loader = torch.utils.data.DataLoader(dataset, collate_fn=alphabet.get_batch_converter(truncation),
                                         batch_sampler=batches)
    layers = [(i + model.num_layers + 1) % (model.num_layers + 1) for i in repr_layers]
    results = {}
    with torch.no_grad():
        for labels, strs, toks in loader:
            out = model(toks, repr_layers=layers, return_contacts="contacts" in include)
            reps = out["representations"]
            for i, label in enumerate(labels):
                n = min(truncation, len(strs[i]))
                result = {"label": label}
                if "per_tok" in include:
                    result["representations"] = {k: t[i, 1:n + 1].clone() for k, t in reps.items()}
                if "mean" in include:
                    result["mean_representations"] = {k: t[i, 1:n + 1].mean(0).clone() for k, t in reps.items()}
                if "bos" in include:
                    result["bos_representations"] = {k: t[i, 0].clone() for k, t in reps.items()}
                if "contacts" in include:
                    result["contacts"] = out["contacts"][i, :n, :n].clone()
                results[label] = result
    return results


def assert_same(ours: dict, ref: dict, atol: float = 1e-4) -> None:
    assert set(ours) == set(ref)
    for label, want in ref.items():
        have = ours[label]
        assert set(have) == set(want), label
        for key, value in want.items():
            if isinstance(value, dict):
                assert set(have[key]) == set(value)
                for layer in value:
                    torch.testing.assert_close(have[key][layer], value[layer], atol=atol, rtol=1e-4)
            elif torch.is_tensor(value):
                torch.testing.assert_close(have[key], value, atol=atol, rtol=1e-4)
            else:
                assert have[key] == value


@pytest.fixture()
def fasta(tmp_path) -> Path:
    path = tmp_path / "seqs.fasta"
    path.write_text(FASTA)
    return path


@pytest.mark.parametrize("truncation", [1022, 20])
def test_pt_files_equal_extract_py(tmp_path, fasta, truncation):
    from ptq_protein.models.tiny import tiny_esm2

    model, alphabet = tiny_esm2(seed=0)[:2]
    model.eval()
    include = ("mean", "per_tok", "bos", "contacts")
    ref = extract_py(model, alphabet, fasta, [0, 1, -1], include, 100, truncation)
    out = tmp_path / "out"
    assert main(["embed", "tiny-esm2", str(fasta), "--out", str(out), "--repr-layers", "0", "1", "-1", "--include",
                 *include, "--toks-per-batch", "100", "--truncation-seq-length", str(truncation), "--quiet"]) == 0
    ours = {}
    for path in out.glob("*.pt"):
        result = torch.load(path, weights_only=True)
        assert path.name == f"{result['label']}.pt"  # extract.py's file names: the label, as it is
        ours[result["label"]] = result
    assert_same(ours, ref)
    if truncation == 20:
        assert ours["d"]["representations"][2].shape == (20, 64) and ours["d"]["contacts"].shape == (20, 20)


def test_transformers_model_equals_extract_py(tmp_path, fasta, hf_esm2):
    from ptq_protein.models.tiny import tiny_esm2

    model, alphabet = tiny_esm2(seed=0)[:2]  # the same weights as tiny_hf_esm2(seed=0)
    ref = extract_py(model.eval(), alphabet, fasta, [0, -1], ("mean", "bos", "contacts"), 4096, 1022)
    run = EmbedRun(fasta_labels(fasta), tmp_path / "hf", EmbedOptions((0, -1), ("mean", "bos", "contacts")))
    run.run(hf_esm2, {"name": "tiny-esm2-hf"})
    from ptq_protein import read_embeddings

    assert_same(read_embeddings(tmp_path / "hf"), ref)


def test_logits_are_the_residue_rows(tmp_path, fasta, esm2):
    run = EmbedRun(fasta_labels(fasta), tmp_path / "o", EmbedOptions((), ("logits",)))
    run.run(esm2, {"name": "tiny-esm2"})
    from ptq_protein import read_embeddings

    got = read_embeddings(tmp_path / "o")["b"]["logits"]
    tokens = torch.tensor([[0] + [esm.Alphabet.from_architecture("ESM-1b").get_idx(a) for a in "MENDELKKLLAAGHRW"]
                           + [2]])
    with torch.no_grad():
        want = esm2(tokens)["logits"][0, 1:-1]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
