"""``ptq-protein fold``: fold sequences with an ESMFold artifact (or float model), one PDB each."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ptq_protein.cli.common import (
    add_duplicates_option,
    add_json_option,
    add_runtime_options,
    input_notes,
    memory_size,
    print_json,
    resolve_device,
    say_input_changes,
    show_progress,
)
from ptq_protein.cli.models_arg import (
    MODEL_HELP,
    add_model_options,
    check_model_or_artifact,
    load_model_or_artifact,
    model_hint,
)

EXAMPLES = """examples:
  ptq-protein fold runs/tiny-esmfold-w8a8-pwlq --fasta targets.fasta --out preds/
  ptq-protein fold esmfold --fasta targets.fasta --out preds-fp/          # the float model, for comparison
  ptq-protein fold esmfold --fasta long.fasta --out preds/ --pair-bits 8 --max-memory 16G   # long sequences
  ptq-protein fold runs/esmfold-w8a8 --fasta many.fasta --out preds/ --shard 2/4     # job 2 of an array of 4
  torchrun --nproc-per-node 4 -m ptq_protein.cli.main fold runs/esmfold-w8a8 --fasta many.fasta --out preds/ \
      --device cuda                                   # each rank folds its share, one GPU each

Before each sequence the fold's peak memory is predicted: the largest chunk size that fits
--max-memory is used, and a sequence that cannot fit is refused in one line (exit 2 at the end,
the other sequences folded). A fold whose polled peak went over the budget is reported in one line.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("fold", help="fold sequences with an ESMFold artifact or model, write PDB files",
                              description="Fold every sequence of a FASTA file; writes OUT/<id>.pdb with pLDDT "
                                          "(0-100, AlphaFold DB's scale; transformers' infer_pdb writes 0-1) in "
                                          "the B-factor column.",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="an artifact folder from 'ptq-protein quantize', or " + MODEL_HELP)
    p.add_argument("--fasta", required=True, help="sequences to fold (FASTA, .gz allowed)")
    p.add_argument("--out", required=True, help="folder for the PDB files")
    p.add_argument("--num-recycles", type=int, help="recycles (default: the model's)")
    p.add_argument("--max-memory", metavar="SIZE", type=memory_size,
                   help="memory the fold may use, e.g. 16G (default: what this machine has available)")
    p.add_argument("--pair-bits", type=int, choices=[8],
                   help="hold the trunk's pair activations in int8 (token-wise scales): about a third of the "
                        "memory, for sequences too long for float pairs")
    p.add_argument("--shard", metavar="K/N", help="fold only the K-th of N shares of the FASTA, into the same --out "
                                                  "as the others (job arrays); under torchrun each rank takes its "
                                                  "share without it")
    p.add_argument("--force", action="store_true",
                   help="replace PDBs an earlier fold wrote into --out (other files are never replaced)")
    add_duplicates_option(p)
    add_model_options(p)
    add_runtime_options(p)
    add_json_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ptq_protein import __version__
    from ptq_protein.data.fasta import read_fasta
    from ptq_protein.eval.bench.folding import check_fold_folder, check_fold_outputs, fold_to_pdbs, require_esmfold
    from ptq_protein.models.adapters import ESM_ALPHABET_LETTERS
    from ptq_protein.support.digests import records_digest
    from ptq_protein.workflows.memory_budget import resident_bytes
    from ptq_protein.workloads.embed_memory import check_budget
    from ptq_protein.workloads.shards import choose_shard, rank_device

    max_memory = args.max_memory  # bytes (parsed by memory_size)
    check_budget(max_memory, resident_bytes(), "before loading the model")  # a budget already spent: refused now
    changes: dict = {}
    records = read_fasta(Path(args.fasta), alphabet=ESM_ALPHABET_LETTERS, changes=changes,
                         duplicates=args.duplicates)  # no length cap
    shard = choose_shard(args.shard)
    artifact = check_model_or_artifact(args, "fold")
    identity = {"tool": "ptq-protein fold", "format_version": 1, "fasta_sha256": records_digest(records),
                "options": {"num_recycles": args.num_recycles, "pair_bits": args.pair_bits,
                            "dtype": args.dtype or "float32"}}
    check_fold_folder(Path(args.out), identity, model_hint(args, artifact))  # another run's folder: refused now
    records = [records[i] for i in shard.select([len(seq) for _, seq in records])]
    check_fold_outputs(Path(args.out), records, args.force)  # --out a file, PDBs in the way: before the model loads
    notes = input_notes(records, changes, _fold_notes)  # what reading and ESMFold change
    model, model_identity = load_model_or_artifact(args, artifact, rank_device(resolve_device(args.device)),
                                                   streamed=True)
    require_esmfold(model)
    if args.pair_bits is not None:
        from ptq_protein.nn.pair_int8 import use_pair_int8

        use_pair_int8(model, args.pair_bits)
    refused: dict = {}
    identity["model"] = {**model_identity, "ptq_protein": __version__.split("+")[0]}
    written = fold_to_pdbs(model, records, Path(args.out), args.num_recycles, progress=show_progress(args),
                           force=args.force, max_memory=max_memory, refused=refused,
                           shard_tag=None if shard.count == 1 else shard.tag, identity=identity)
    _report(args, model, written, refused, notes)
    return 2 if refused else 0


def _fold_notes(seq: str) -> str:
    """What ESMFold changes in ``seq``, and whether it is longer than ESMFold's language model was trained on."""
    from ptq_protein.eval.bench.folding import esmfold_input_notes
    from ptq_protein.models.adapters import ESM2_MAX_RESIDUES

    long = (f"{len(seq)} residues; ESMFold's language model was trained on at most {ESM2_MAX_RESIDUES}, so "
            "accuracy beyond that is not established" if len(seq) > ESM2_MAX_RESIDUES else "")
    return "; ".join(n for n in (esmfold_input_notes(seq), long) if n)


def _report(args: argparse.Namespace, model, written: dict, refused: dict, notes: dict) -> None:
    """The table or JSON on stdout; input changes, a missing PAE and refusals on stderr, one line each."""
    from ptq_protein.nn.int_exec import engine_used
    from ptq_protein.nn.pair_int8 import pair_bits_of

    no_pae = ""
    if any(f.pae is None for f in written.values()):
        given = "--pair-bits 8" if args.pair_bits else f"the artifact's pair_bits={pair_bits_of(model)}"
        no_pae = (f"no PAE: {given} holds the pair activations in int8 and reads them in row chunks, so the "
                  "[L, L, 64] aligned-error logits are never held (pTM is computed chunk by chunk); fold without "
                  "int8 pairs for PAE")
    if args.json:
        # engine: which integer GEMM ran (onednn = the CPU fast path, reference = exact torch/Triton),
        # null for float/fake
        print_json({"out": args.out, "mean_plddt": {k: v.plddt for k, v in written.items()},
                    "ptm": {k: v.ptm for k, v in written.items()},
                    "pae": {k: None if v.pae is None else str(v.pae) for k, v in written.items()},
                    "pdb": {k: str(v.path) for k, v in written.items()}, "engine": engine_used(model),
                    "input_changes": notes, "pae_absent": no_pae or None, "refused": refused})
    else:
        for seq_id, folded in written.items():
            ptm = "-" if folded.ptm is None else f"{folded.ptm:.3f}"
            print(f"{seq_id}\tmean pLDDT {folded.plddt:.1f}\tpTM {ptm}\t{folded.path}")
    kept = {seq_id: line for seq_id, line in notes.items() if seq_id in written}  # not a refused sequence's
    say_input_changes("fold", {**kept, **({"pae": no_pae} if no_pae else {})})
    for reason in refused.values():
        print(f"ptq-protein fold: not folded: {reason}", file=sys.stderr)
