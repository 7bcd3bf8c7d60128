#!/usr/bin/env python3
"""fair-esm's ``scripts/extract.py``, as its README runs it, for the bench's anchor rows (a whole process each).

fair-esm's pip package does not ship its scripts, so this is that script (facebookresearch/esm,
``scripts/extract.py`` on main) with two differences, both marked below:

* torch >= 2.6 loads with ``weights_only=True``, which refuses the ``argparse.Namespace`` fair-esm's hub files
  pickle as their ``cfg``: the class is allowed first (``add_safe_globals``), as a user on a current torch must;
* ``--quantize-dynamic`` (not in fair-esm): ``torch.ao.quantization.quantize_dynamic`` (int8 ``Linear``) after
  loading, the one-line int8 a user of this loop tries first.

Everything else is fair-esm's code path: ``pretrained.load_model_and_alphabet`` on the local file (it reads
``NAME-contact-regression.pt`` beside it), ``FastaBatchedDataset`` and ``get_batch_indices``, its batch converter,
``repr_layers``, and one ``LABEL.pt`` per sequence with the representations asked for.

    python scripts/bench/loops/extract.py esm2_t12_35M_UR50D.pt seqs.fasta out/ --include mean
"""

import argparse
import pathlib

import torch
from esm import FastaBatchedDataset, MSATransformer, pretrained


def create_parser():
    parser = argparse.ArgumentParser(
        description="Extract per-token representations and model outputs for sequences in a FASTA file"
    )
    parser.add_argument("model_location", type=str,
                        help="PyTorch model file OR name of pretrained model to download (see README for models)")
    parser.add_argument("fasta_file", type=pathlib.Path, help="FASTA file on which to extract representations")
    parser.add_argument("output_dir", type=pathlib.Path, help="output directory for extracted representations")
    parser.add_argument("--toks_per_batch", type=int, default=4096, help="maximum batch size")
    parser.add_argument("--repr_layers", type=int, default=[-1], nargs="+",
                        help="layers indices from which to extract representations (0 to num_layers, inclusive)")
    parser.add_argument("--include", type=str, nargs="+", choices=["mean", "per_tok", "bos", "contacts"],
                        help="specify which representations to return", required=True)
    parser.add_argument("--truncation_seq_length", type=int, default=1022,
                        help="truncate sequences longer than the given value")
    parser.add_argument("--nogpu", action="store_true", help="Do not use GPU even if available")
    # not in fair-esm: the bench's quantize_dynamic anchor
    parser.add_argument("--quantize-dynamic", action="store_true",
                        help="(bench) torch.ao quantize_dynamic: int8 Linear layers, dynamic activation scales")
    return parser


def run(args):
    torch.serialization.add_safe_globals([argparse.Namespace])  # not in fair-esm: torch >= 2.6 (see above)
    model, alphabet = pretrained.load_model_and_alphabet(args.model_location)
    model.eval()
    if isinstance(model, MSATransformer):
        raise ValueError("This script currently does not handle models with MSA input (MSA Transformer).")
    if args.quantize_dynamic:  # not in fair-esm (see above)
        from torch.ao.quantization import quantize_dynamic

        model = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    if torch.cuda.is_available() and not args.nogpu:
        model = model.cuda()
        print("Transferred model to GPU")

    dataset = FastaBatchedDataset.from_file(args.fasta_file)
    batches = dataset.get_batch_indices(args.toks_per_batch, extra_toks_per_seq=1)
    data_loader = torch.utils.data.DataLoader(
        dataset, collate_fn=alphabet.get_batch_converter(args.truncation_seq_length), batch_sampler=batches
    )
    print(f"Read {args.fasta_file} with {len(dataset)} sequences")

    args.output_dir.mkdir(parents=True, exist_ok=True)
    return_contacts = "contacts" in args.include

    assert all(-(model.num_layers + 1) <= i <= model.num_layers for i in args.repr_layers)
    repr_layers = [(i + model.num_layers + 1) % (model.num_layers + 1) for i in args.repr_layers]

    with torch.no_grad():
        for batch_idx, (labels, strs, toks) in enumerate(data_loader):
            print(f"Processing {batch_idx + 1} of {len(batches)} batches ({toks.size(0)} sequences)")
            if torch.cuda.is_available() and not args.nogpu:
                toks = toks.to(device="cuda", non_blocking=True)

            out = model(toks, repr_layers=repr_layers, return_contacts=return_contacts)

            logits = out["logits"].to(device="cpu")  # noqa: F841  (fair-esm computes it and leaves it unused)
            representations = {layer: t.to(device="cpu") for layer, t in out["representations"].items()}
            if return_contacts:
                contacts = out["contacts"].to(device="cpu")

            for i, label in enumerate(labels):
                args.output_file = args.output_dir / f"{label}.pt"
                args.output_file.parent.mkdir(parents=True, exist_ok=True)
                result = {"label": label}
                truncate_len = min(args.truncation_seq_length, len(strs[i]))
                # Call clone on tensors to ensure tensors are not views into a larger representation
                if "per_tok" in args.include:
                    result["representations"] = {
                        layer: t[i, 1: truncate_len + 1].clone() for layer, t in representations.items()
                    }
                if "mean" in args.include:
                    result["mean_representations"] = {
                        layer: t[i, 1: truncate_len + 1].mean(0).clone() for layer, t in representations.items()
                    }
                if "bos" in args.include:
                    result["bos_representations"] = {layer: t[i, 0].clone() for layer, t in representations.items()}
                if return_contacts:
                    result["contacts"] = contacts[i, :truncate_len, :truncate_len].clone()

                torch.save(result, args.output_file)


def main():
    parser = create_parser()
    args = parser.parse_args()
    run(args)


if __name__ == "__main__":
    main()
