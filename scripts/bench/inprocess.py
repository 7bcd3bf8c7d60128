"""The in-process rows of the embed and score benches, and the oneDNN probe: one child process each, run by
``embed.py``, ``score.py`` and ``onednn_reorders.py`` with the row's threads and instruction sets.

In-process means the models are loaded once and only the loops are timed (no interpreter start, no load): the
library path (``pp.load`` + a loop; this process does not call the CLI's heap policy). Each row runs once untimed
(warm-up), then ``--reps`` interleaved passes; the median is kept. Subcommands (results as JSON to ``--json``):

* ``embed``: fair-esm's extract.py loop (FP32, and with ``quantize_dynamic``), transformers ``EsmModel`` (SDPA)
  FP32 and BF16 over the embed command's batches, the library's embed run on the FP model and on each artifact;
  and the last layer's per-token error against FP32 (relative Frobenius norm over every residue of the first
  ``ERROR_SEQS`` sequences) for each artifact, ``quantize_dynamic`` and the HF BF16 model;
* ``score``: predict.py's masked-marginals loop (one forward per masked position) and the library's batched
  masked copies (FP model, each artifact);
* ``verbose``: one batch of an artifact forward twice, a marker line between them on stdout (for
  ``ONEDNN_VERBOSE``: what runs after the first forward).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

import torch

from bench.common import interleaved, medians, run_measured

TOKS = 4096
ERROR_SEQS = 24
MARKER = "=== bench: first forward done ==="


def fair_esm_loop(model, alphabet, fasta: Path, net=None) -> Callable[[], int]:
    """fair-esm extract.py's loop (mean of the last layer, kept in memory) on ``net`` (default ``model``)."""
    import esm

    def run() -> int:
        dataset = esm.FastaBatchedDataset.from_file(str(fasta))
        batches = dataset.get_batch_indices(TOKS, extra_toks_per_seq=1)
        loader = torch.utils.data.DataLoader(dataset, collate_fn=alphabet.get_batch_converter(1022),
                                             batch_sampler=batches)
        done = 0
        with torch.no_grad():
            for _labels, strs, toks in loader:
                out = (net or model)(toks, repr_layers=[model.num_layers])["representations"][model.num_layers]
                for i, s in enumerate(strs):
                    out[i, 1:len(s) + 1].mean(0).clone()
                    done += len(s)
        return done
    return run


def hf_sdpa_loop(hf_model, records: Sequence[Tuple[str, str]]) -> Callable[[], int]:
    """transformers EsmModel (SDPA) over the embed command's token batches."""
    from ptq_protein.models.lm_outputs import lm_forward, lm_tokens
    from ptq_protein.workloads.token_batches import token_batches

    plan = token_batches([len(s) for _, s in records], TOKS)

    def run() -> int:
        for batch in plan.batches:
            lm_forward(hf_model, lm_tokens([records[i][1] for i in batch]), [hf_model.config.num_hidden_layers])
        return sum(len(s) for _, s in records)
    return run


def embed_run(model, records, scratch: Path, name: str) -> Callable[[], int]:
    """The library's embed run (what ``ptq-protein embed`` runs after loading) into a fresh folder each time."""
    from ptq_protein.workloads.embed import EmbedOptions
    from ptq_protein.workloads.embed_run import EmbedRun

    counter = [0]

    def run() -> int:
        counter[0] += 1
        out = scratch / f"{name}-{counter[0]}"
        return EmbedRun(records, out, EmbedOptions((-1,), ("mean",), TOKS)).run(model, {"name": name}).stats.residues
    return run


def per_token_error(reference, model, records) -> float:
    """||model - reference||_F / ||reference||_F of the last layer's per-residue states over ``records``."""
    from ptq_protein.models.lm_outputs import lm_forward, lm_info, lm_tokens

    num, den = 0.0, 0.0
    for _, seq in records:
        tokens = lm_tokens([seq])
        a = lm_forward(reference, tokens, [lm_info(reference).last_layer]).representations
        b = lm_forward(model, tokens, [lm_info(model).last_layer]).representations
        a, b = next(iter(a.values()))[0, 1:-1], next(iter(b.values()))[0, 1:-1].float()
        num, den = num + float((a - b).pow(2).sum()), den + float(a.pow(2).sum())
    return (num / den) ** 0.5


def timed(rows: Dict[str, Callable[[], object]], reps: int) -> Dict[str, float]:
    """One untimed warm-up pass of every row, then the median seconds of ``reps`` interleaved passes."""
    for run in rows.values():
        run()
    return medians(interleaved(rows, reps))


def embed_rows(args) -> Tuple[Dict[str, Callable[[], object]], Dict[str, float], int]:
    """Every in-process embed row, the per-token errors (by the whole-process row key), and the residues."""
    import esm
    from torch.ao.quantization import quantize_dynamic
    from transformers import EsmModel

    import ptq_protein as pp
    from ptq_protein.models.loading import load_model
    from ptq_protein.workloads.embed_run import fasta_labels

    records = fasta_labels(args.fasta)
    torch.serialization.add_safe_globals([argparse.Namespace])
    fair, alphabet = esm.pretrained.load_model_and_alphabet_local(args.checkpoint)
    fair.eval()
    ours = load_model(args.checkpoint).model
    hf = EsmModel.from_pretrained(args.hf, attn_implementation="sdpa").eval()
    with warnings.catch_warnings():  # torch.ao's deprecation notices: the anchor users still run
        warnings.simplefilter("ignore")
        dynamic = quantize_dynamic(fair, {torch.nn.Linear}, dtype=torch.qint8)
    scratch = Path(tempfile.mkdtemp(prefix="bench_inprocess_"))
    rows = {"fair-esm extract.py loop, FP32": fair_esm_loop(fair, alphabet, args.fasta),
            "transformers EsmModel SDPA, FP32": hf_sdpa_loop(hf, records),
            "torch.ao quantize_dynamic in extract.py's loop": fair_esm_loop(fair, alphabet, args.fasta, dynamic),
            "library embed run, FP32": embed_run(ours, records, scratch, "fp32")}
    subset = records[:ERROR_SEQS]
    errors = {"dyn": per_token_error(fair, dynamic, subset)}
    if args.bf16:
        hf16 = EsmModel.from_pretrained(args.hf, attn_implementation="sdpa").eval().to(torch.bfloat16)
        rows["transformers EsmModel SDPA, BF16"] = hf_sdpa_loop(hf16, records)
        errors["hf16"] = per_token_error(fair, hf16, subset)
    for key, path in (item.split("=", 1) for item in args.artifact):
        model = pp.load(path)
        rows[f"library embed run, {key.split(':')[-1]} artifact ({key.split(':')[1]}), pp.load"] = \
            embed_run(model, records, scratch, key.replace(":", "-"))
        errors[key] = per_token_error(fair, model, subset)
    return rows, errors, sum(len(s) for _, s in records)


def predict_loop(model, sequence: str) -> torch.Tensor:
    """predict.py's masked-marginals: mask one position, one forward, log-softmax there; [L + 2, V]."""
    from ptq_protein.models.lm_outputs import lm_forward, lm_tokens
    from ptq_protein.models.tokens import esm_vocab

    tokens, mask = lm_tokens([sequence]), esm_vocab().index("<mask>")
    rows = []
    for i in range(tokens.shape[1]):
        masked = tokens.clone()
        masked[0, i] = mask
        rows.append(torch.log_softmax(lm_forward(model, masked).logits[0, i], dim=-1))
    return torch.stack(rows)


def score_rows(args) -> Dict[str, Callable[[], object]]:
    import ptq_protein as pp
    from ptq_protein.models.loading import load_model
    from ptq_protein.workloads.variant_scores import single_mutant_scores

    model = load_model(args.checkpoint).model
    rows: Dict[str, Callable[[], object]] = {"predict.py loop (one masked forward each), FP32":
                                             lambda: predict_loop(model, args.sequence)}
    nets = {"FP32": model, **{key.split(":")[-1]: pp.load(path)
                              for key, path in (item.split("=", 1) for item in args.artifact)}}
    for name, net in nets.items():
        rows[f"library masked-marginals, {name}"] = (
            lambda net=net: single_mutant_scores(net, args.sequence, "masked-marginals").grid)
    return rows


def verbose_probe(args) -> None:
    """One batch of the artifact, forward twice; :data:`MARKER` between them, stdio flushed on both sides."""
    import ptq_protein as pp
    from ptq_protein.models.lm_outputs import lm_forward, lm_info, lm_tokens
    from ptq_protein.workloads.embed_run import fasta_labels
    from ptq_protein.workloads.token_batches import token_batches

    model = pp.load(args.artifact[0])
    records = fasta_labels(args.fasta)
    first = token_batches([len(s) for _, s in records], TOKS).batches[0]
    tokens = lm_tokens([records[i][1] for i in first])
    layer = lm_info(model).num_layers
    libc = ctypes.CDLL(None)
    lm_forward(model, tokens, [layer])
    sys.stdout.flush()
    libc.fflush(None)  # oneDNN's verbose lines go through C stdio: flushed before the marker
    os.write(1, f"{MARKER} tokens {tuple(tokens.shape)} engine {pp.engine_used(model)}\n".encode())
    lm_forward(model, tokens, [layer])
    libc.fflush(None)


def artifact_args(arts: Mapping[Tuple[str, str], Path]) -> List[str]:
    """``--artifact=art:SOURCE:RECIPE=FOLDER`` for each artifact (keys: the whole-process rows')."""
    return [f"--artifact=art:{source}:{recipe}={path}" for (source, recipe), path in arts.items()]


def run_child(what: str, args: Sequence[str], reps: int, env: Mapping[str, str], scratch: Path) -> dict:
    """Run ``python -m bench.inprocess WHAT ARGS`` (parent side); its JSON, or {"failure": one line}."""
    out = scratch / f"inprocess-{what}.json"
    cmd = [sys.executable, "-m", "bench.inprocess", what, *args, "--reps", str(reps), "--json", str(out)]
    done = run_measured(cmd, env, log=scratch / f"inprocess-{what}.log")
    return json.loads(out.read_text()) if done.returncode == 0 else {"failure": done.failure()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["embed", "score", "verbose"])
    p.add_argument("--checkpoint", help="fair-esm checkpoint file")
    p.add_argument("--hf", help="the same weights as an HF folder (embed)")
    p.add_argument("--fasta", type=Path, help="sequences (embed, verbose)")
    p.add_argument("--sequence", help="the protein scored (score)")
    p.add_argument("--artifact", action="append", default=[], help="KEY=FOLDER (embed, score) or FOLDER (verbose)")
    p.add_argument("--bf16", action="store_true", help="embed: add the HF BF16 row")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--json", type=Path, help="where the results go")
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    if args.what == "verbose":
        verbose_probe(args)
        return 0
    if args.what == "embed":
        rows, errors, residues = embed_rows(args)
    else:
        rows, errors, residues = score_rows(args), {}, len(args.sequence)
    seconds = timed(rows, args.reps)
    result = {"seconds": seconds, "residues": residues, "errors": errors, "reps": args.reps}
    args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
