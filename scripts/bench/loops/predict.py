#!/usr/bin/env python3
"""fair-esm's ``examples/variant-prediction/predict.py`` (masked-marginals and wt-marginals), for the score bench.

fair-esm's pip package does not ship its examples, so this is that script's ESM-2 path (facebookresearch/esm,
``examples/variant-prediction/predict.py``): ``pretrained.load_model_and_alphabet``, then for masked-marginals
one forward per token position, batch 1 (BOS and EOS included, as the script loops over every column of the
tokens), ``log_softmax`` of the logits at the masked position, and each DMS row's score
``log p(mt) - log p(wt)`` at that residue. Differences, marked below:

* it runs on the CPU: the script calls ``.cuda()`` on every input unconditionally, so as published it runs on a
  GPU only;
* pandas is not a dependency of this project: the CSV is read and written with ``csv`` (the same columns: an
  index, the DMS's columns, then one score column named by the model location, as ``df.to_csv`` writes);
* torch >= 2.6 needs the ``argparse.Namespace`` of fair-esm's files allowed (``add_safe_globals``);
* MSA Transformer and pseudo-ppl are left out (the bench times masked-marginals on ESM-2).

    python scripts/bench/loops/predict.py --model-location esm2_t12_35M_UR50D.pt --sequence MKT... \\
        --dms-input singles.csv --dms-output scored.csv --offset-idx 1 --scoring-strategy masked-marginals
"""

import argparse
import csv
import pathlib

import torch
from esm import pretrained
from tqdm import tqdm


def create_parser():
    parser = argparse.ArgumentParser(description="Label a deep mutational scan with predictions from ESM models.")
    parser.add_argument("--model-location", type=str, nargs="+",
                        help="PyTorch model file OR name of pretrained model to download (see README for models)")
    parser.add_argument("--sequence", type=str, help="Base sequence to which mutations were applied")
    parser.add_argument("--dms-input", type=pathlib.Path, help="CSV file containing the deep mutational scan")
    parser.add_argument("--mutation-col", type=str, default="mutant",
                        help="column in the deep mutational scan labeling the mutation as 'AiB'")
    parser.add_argument("--dms-output", type=pathlib.Path,
                        help="Output file containing the deep mutational scan along with predictions")
    parser.add_argument("--offset-idx", type=int, default=0,
                        help="Offset of the mutation positions in `--mutation-col`")
    parser.add_argument("--scoring-strategy", type=str, default="wt-marginals",
                        choices=["wt-marginals", "masked-marginals"], help="")
    parser.add_argument("--nogpu", action="store_true", help="Do not use GPU even if available")
    return parser


def label_row(row, sequence, token_probs, alphabet, offset_idx):
    wt, idx, mt = row[0], int(row[1:-1]) - offset_idx, row[-1]
    assert sequence[idx] == wt, "The listed wildtype does not match the provided sequence"

    wt_encoded, mt_encoded = alphabet.get_idx(wt), alphabet.get_idx(mt)

    # add 1 for BOS
    score = token_probs[0, 1 + idx, mt_encoded] - token_probs[0, 1 + idx, wt_encoded]
    return score.item()


def main(args):
    with open(args.dms_input, newline="") as handle:  # pd.read_csv (see above)
        rows = list(csv.DictReader(handle))
    columns = list(rows[0]) if rows else [args.mutation_col]
    torch.serialization.add_safe_globals([argparse.Namespace])  # torch >= 2.6 (see above)

    for model_location in args.model_location:
        model, alphabet = pretrained.load_model_and_alphabet(model_location)
        model.eval()
        if torch.cuda.is_available() and not args.nogpu:
            model = model.cuda()
            print("Transferred model to GPU")
        device = next(model.parameters()).device  # fair-esm: .cuda() (see above)

        batch_converter = alphabet.get_batch_converter()
        data = [("protein1", args.sequence)]
        batch_labels, batch_strs, batch_tokens = batch_converter(data)

        if args.scoring_strategy == "wt-marginals":
            with torch.no_grad():
                token_probs = torch.log_softmax(model(batch_tokens.to(device))["logits"], dim=-1)
        else:  # masked-marginals
            all_token_probs = []
            for i in tqdm(range(batch_tokens.size(1))):
                batch_tokens_masked = batch_tokens.clone()
                batch_tokens_masked[0, i] = alphabet.mask_idx
                with torch.no_grad():
                    token_probs = torch.log_softmax(model(batch_tokens_masked.to(device))["logits"], dim=-1)
                all_token_probs.append(token_probs[:, i])  # vocab size
            token_probs = torch.cat(all_token_probs, dim=0).unsqueeze(0)
        token_probs = token_probs.cpu()
        for row in rows:  # df.apply(label_row, axis=1)
            row[model_location] = label_row(row[args.mutation_col], args.sequence, token_probs, alphabet,
                                            args.offset_idx)
        columns.append(model_location)

    with open(args.dms_output, "w", newline="") as handle:  # df.to_csv: the index first
        writer = csv.writer(handle)
        writer.writerow(["", *columns])
        writer.writerows([i, *(row[c] for c in columns)] for i, row in enumerate(rows))


if __name__ == "__main__":
    parser = create_parser()
    args = parser.parse_args()
    main(args)
