#!/usr/bin/env python3
"""The embed bench's OpenVINO loop: an OpenVINO IR of ``EsmModel`` (``ov_convert.py``) over a FASTA, with the HF
loop's batches and output (``hf_loop.embed_fasta``: length-sorted 4096-token batches, one extract.py-style
``LABEL.pt`` per sequence holding the mean of the last layer).

What a user of OpenVINO writes: ``core.read_model(IR)`` and ``core.compile_model(model, "CPU", config)``, the
ids made from the model folder's ``vocab.txt`` (``<cls>``, one id per residue, ``<eos>``, ``<pad>`` after; no
transformers import, so the process's time is OpenVINO's and torch's, which writes the ``.pt`` files). Config:

* default: OpenVINO's own (on a CPU with avx512_bf16 or AMX its CPU plugin infers in bf16);
* ``--f32``: ``INFERENCE_PRECISION_HINT=f32`` (OpenVINO's FP32).

``INFERENCE_NUM_THREADS`` is ``OMP_NUM_THREADS`` when that is set (the bench's thread count).
"""

import argparse
import json
import os
import pathlib

import torch
from hf_loop import embed_fasta  # the HF loop's batches and output, beside this file

VOCAB = "vocab.txt"


class PlainTokenizer:
    """ESM-2 ids from a ``vocab.txt`` (line i is id i), called as ``EsmTokenizer`` is for amino-acid strings:
    ``tokenizer(sequences, padding=True, return_tensors="pt")`` gives ``input_ids`` and ``attention_mask``."""

    def __init__(self, vocab_file):
        tokens = [ln.strip() for ln in pathlib.Path(vocab_file).read_text().splitlines() if ln.strip()]
        self.index = {token: i for i, token in enumerate(tokens)}
        self.cls, self.eos, self.pad, self.unk = (self.index[t] for t in ("<cls>", "<eos>", "<pad>", "<unk>"))

    def __call__(self, sequences, padding=True, return_tensors="pt"):
        rows = [[self.cls, *(self.index.get(a, self.unk) for a in seq), self.eos] for seq in sequences]
        ids = torch.full((len(rows), max(map(len, rows))), self.pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask}


def ov_forward(ir, f32=False):
    """``forward(ids, mask)`` -> last hidden state (a torch tensor) from the IR compiled for the CPU."""
    import openvino as ov

    config = {"INFERENCE_PRECISION_HINT": "f32"} if f32 else {}
    threads = int(os.environ.get("OMP_NUM_THREADS", "0"))
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    core = ov.Core()
    compiled = core.compile_model(core.read_model(ir), "CPU", config)
    output = compiled.output(0)

    def forward(ids, mask):
        return torch.from_numpy(compiled([ids.numpy(), mask.numpy()])[output])
    return forward


def num_layers(folder):
    """The ``num_hidden_layers`` of a Hugging Face folder's ``config.json`` (the key extract.py's files use)."""
    return json.loads((pathlib.Path(folder) / "config.json").read_text())["num_hidden_layers"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="the Hugging Face ESM-2 folder the IR was made from (vocab.txt, config.json)")
    parser.add_argument("fasta", type=pathlib.Path)
    parser.add_argument("output_dir", type=pathlib.Path)
    parser.add_argument("--ir", type=pathlib.Path, required=True, help="the OpenVINO IR (.xml) to run")
    parser.add_argument("--f32", action="store_true", help="INFERENCE_PRECISION_HINT=f32")
    args = parser.parse_args(argv)
    tokenizer = PlainTokenizer(pathlib.Path(args.model) / VOCAB)
    embed_fasta(args.fasta, tokenizer, ov_forward(args.ir, args.f32), num_layers(args.model), args.output_dir)


if __name__ == "__main__":
    main()
