"""``ptq-protein embed``: embeddings of a whole FASTA, as fair-esm's ``extract.py`` writes them (or HDF5)."""

from __future__ import annotations

import argparse
import sys

from ptq_protein.cli.common import (
    add_duplicates_option,
    add_runtime_options,
    input_notes,
    memory_size,
    printable,
    resolve_device,
    say_input_changes,
    show_progress,
)
from ptq_protein.cli.models_arg import (
    MODEL_HELP,
    add_backend_option,
    add_model_options,
    check_model_or_artifact,
    load_model_or_artifact,
    model_hint,
    run_backend,
)

EXAMPLES = """examples:
  ptq-protein embed esm2_t33_650M_UR50D seqs.fasta --out emb/ --repr-layers -1 --include mean
  ptq-protein embed runs/650m-w8a8 seqs.fasta --out emb-q/ --include mean per_tok --format h5
  ptq-protein embed runs/650m-w8a8 big.fasta --out emb/ --shard 3/8       # job 3 of an array of 8
  torchrun --nproc-per-node 4 -m ptq_protein.cli.main embed runs/650m-w8a8 big.fasta --out emb/ --device cuda

--format pt writes OUT/LABEL.pt, the files fair-esm's scripts/extract.py writes (label = the whole
header line); --format h5 writes OUT/embeddings.K-of-N.h5. Read either with
ptq_protein.read_embeddings(OUT). Rerunning the same command computes only what is missing.
"""


def register(subparsers) -> None:
    from ptq_protein.workloads.embed_options import INCLUDE_CHOICES

    p = subparsers.add_parser("embed", help="embeddings (and contacts, logits) of every sequence of a FASTA",
                              description="Embed every sequence of a FASTA file with an ESM-2 or ESM C model or "
                                          "artifact; resumable, shardable, within a memory budget.",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="an artifact folder from 'ptq-protein quantize', or " + MODEL_HELP)
    p.add_argument("fasta", help="sequences to embed (FASTA, .gz allowed)")
    p.add_argument("--out", required=True, help="output folder (new, or one an earlier embed run of the same "
                                                "model, options and FASTA wrote: only what is missing is computed)")
    p.add_argument("--repr-layers", type=int, nargs="+", default=[-1], metavar="N",
                   help="layers whose representations to keep; 0 = embeddings, negative counts from the end "
                        "(default: -1, the final LayerNorm's output; ESM C: 1..n are its blocks' own outputs and "
                        "n+1 = -1 its final LayerNorm's)")
    p.add_argument("--include", nargs="+", default=["mean"], choices=INCLUDE_CHOICES,
                   help="what to save per sequence (default: mean)")
    p.add_argument("--toks-per-batch", type=int, default=4096, help="tokens per batch (default: 4096)")
    p.add_argument("--truncation-seq-length", type=int, default=1022,
                   help="truncate longer sequences to this many residues (default: 1022)")
    p.add_argument("--format", default="pt", choices=["pt", "h5"], help="pt: one LABEL.pt each (default); h5: HDF5")
    p.add_argument("--shard", metavar="K/N", help="embed only the K-th of N shares (job arrays); under torchrun "
                                                  "each rank takes its share without it")
    p.add_argument("--max-memory", metavar="SIZE", type=memory_size,
                   help="memory the run may use, e.g. 8G (default: what this machine has available)")
    add_duplicates_option(p)
    add_backend_option(p)
    p.add_argument("--engine", choices=["torch", "openvino"], default="torch",
                   help="what runs an artifact: torch (default; oneDNN integer GEMMs) or openvino (pip install "
                        "'ptq-protein[openvino]'; ESM-2 artifacts on CPUs with VNNI or AMX: int8 GEMMs from the "
                        "artifact's codes, float parts in bfloat16 where the CPU has it unless --dtype float32)")
    add_model_options(p)
    add_runtime_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ptq_protein.workflows.memory_budget import resident_bytes
    from ptq_protein.workloads.embed_memory import check_budget
    from ptq_protein.workloads.embed_options import EmbedOptions
    from ptq_protein.workloads.embed_run import EmbedRun, fasta_labels
    from ptq_protein.workloads.shards import choose_shard, rank_device

    max_memory = args.max_memory  # bytes (parsed by memory_size)
    options = EmbedOptions(tuple(args.repr_layers), tuple(args.include), args.toks_per_batch,
                           args.truncation_seq_length, args.format)
    if options.format == "h5":
        from ptq_protein.workloads.embed_h5 import require_h5py

        require_h5py()
    artifact = check_model_or_artifact(args, "embed")
    openvino = _check_engine(args, artifact, options)
    shard = choose_shard(args.shard)
    device = rank_device(resolve_device(args.device))
    check_budget(max_memory, resident_bytes(), "before loading the model")
    changes: dict = {}
    records = fasta_labels(args.fasta, args.duplicates, changes)
    job = EmbedRun(records, args.out, options, shard,
                   _run_record(args, artifact, device, openvino), model_hint=model_hint(args, artifact))
    model, identity = _load_openvino(args, options) if openvino else load_model_or_artifact(args, artifact, device)
    report = job.run(model, identity, max_memory, show_progress=show_progress(args))
    _summary(report, args.out, shard)
    say_input_changes("embed", input_notes(records, changes))
    for reason in report.refused.values():
        print(f"ptq-protein embed: not embedded: {printable(reason)}", file=sys.stderr)
    return 2 if report.refused else 0


def _check_engine(args: argparse.Namespace, artifact: bool, options) -> bool:
    """True for --engine openvino, refused in one line (before any load) where it cannot run."""
    if args.engine != "openvino":
        return False
    from ptq_protein.interop.openvino_engine import check_request, why_not
    from ptq_protein.support.errors import InputError

    if not artifact:
        raise InputError(f"--engine openvino runs artifacts; {args.model} is a float model: quantize it first "
                         "(ptq-protein quantize MODEL --out ART), or drop --engine")
    if args.backend:
        raise InputError("--backend chooses torch's path for an artifact; drop it with --engine openvino")
    why = why_not(resolve_device(args.device))
    if why:
        raise InputError(why)
    check_request(options.include)
    return True


def _run_record(args: argparse.Namespace, artifact: bool, device: str, openvino: bool) -> dict:
    """What computed the outputs, recorded in the output folder (a rerun computing otherwise is refused)."""
    if openvino:
        return {"backend": "openvino", "dtype": args.dtype or "openvino-default"}
    return {"backend": run_backend(args, artifact, device), "dtype": args.dtype or "float32"}


def _load_openvino(args: argparse.Namespace, options):
    """The artifact compiled by OpenVINO, said in one log line, and its identity."""
    import logging
    from pathlib import Path

    import torch

    from ptq_protein.cli.models_arg import artifact_identity
    from ptq_protein.interop.openvino_engine import load_openvino

    model = load_openvino(Path(args.model), layers=options.repr_layers if options.wants_representations else (),
                          logits="logits" in options.include, dtype=args.dtype, threads=torch.get_num_threads())
    logging.getLogger(__name__).info("running %s", model.engine_words)
    return model, artifact_identity(args.model)


def _summary(report, out: str, shard) -> None:
    stats = report.stats
    part = "" if shard.count == 1 else f" (shard {shard.index}/{shard.count})"
    print(f"embedded {stats.sequences} sequences ({stats.residues} residues) in {stats.seconds:.1f} s, "
          f"{stats.residues_per_second:.0f} residues/s; padding {100 * stats.padding_share:.1f}% of the "
          f"{stats.tokens} tokens computed; {report.skipped} already written{part}; into {out}")
