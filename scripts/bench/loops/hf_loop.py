#!/usr/bin/env python3
"""A plain transformers loop over a FASTA: ``EsmModel`` (SDPA attention), length-sorted 4096-token batches, the
mean of the last hidden state per sequence saved as fair-esm's ``extract.py`` saves it; for the embed bench.

What a user writes without this toolkit (a whole process each): ``EsmTokenizer`` and
``EsmModel.from_pretrained(folder, attn_implementation="sdpa", add_pooling_layer=False)`` (an ESM-2 masked-LM
checkpoint has no pooler: transformers would add a randomly initialised one, unused for embeddings, and with it
torchao's Linear-unary annotation fails on the pooler's dense + tanh), ``torch.no_grad()``, one ``LABEL.pt`` per
sequence holding ``{"label", "mean_representations": {num_layers: mean over the residues}}``. The batches are
fair-esm's ``get_batch_indices`` (sorted by length, filled greedily up to 4096 tokens with BOS/EOS counted), as
users' loops batch, written out here so the loop imports nothing from the toolkit (the bench's tests check it).
Engines (one per run):

* default: FP32;
* ``--bf16``: ``model.to(torch.bfloat16)`` (the means are taken in FP32);
* ``--onnx FILE``: an ONNX file (``ptq-protein export``) in ONNX Runtime, through
  ``ptq_protein.interop.onnx_export.ort_session`` (the session options that keep it exact), with
  ``OMP_NUM_THREADS`` threads;
* ``--pt2e CALIB_FASTA``: torchao's PT2E static W8A8 for x86 (``X86InductorQuantizer``): ``torch.export`` with
  dynamic batch and length, ``prepare_pt2e``, calibration on ``CALIB_FASTA``'s batches, ``convert_pt2e``, then
  ``torch.compile`` (inductor, freezing on, dynamic shapes). The quantizer's global config annotates integer
  nodes of ``EsmModel``'s graph (the token-dropout and mask arithmetic) and its histogram observer fails on them
  (``"histogram_cpu" not implemented for 'Int'``, torchao 0.18 / torch 2.13), so the config is set on every
  ``nn.Linear`` (``set_module_type_qconfig``): W8A8 on the Linear layers, as this toolkit's recipes.
"""

import argparse
import os
import pathlib
import time

import torch

TOKS_PER_BATCH = 4096
EXTRA_TOKENS = 2  # BOS and EOS


def read_fasta(path):
    """(label, sequence) pairs; the label is the whole header line, as fair-esm reads it."""
    records, label, parts = [], None, []
    for line in pathlib.Path(path).read_text().splitlines():
        if line.startswith(">"):
            if label is not None:
                records.append((label, "".join(parts)))
            label, parts = line[1:].strip(), []
        elif line.strip():
            parts.append(line.strip())
    if label is not None:
        records.append((label, "".join(parts)))
    return records


def batch_plan(lengths, toks_per_batch=TOKS_PER_BATCH):
    """Indices grouped shortest first, each batch at most ``toks_per_batch`` tokens padded to its longest."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches, current, longest = [], [], 0
    for i in order:
        size = lengths[i] + EXTRA_TOKENS
        if current and max(size, longest) * (len(current) + 1) > toks_per_batch:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    return batches


def batches_of(records, tokenizer, truncation=1022):
    """(labels, lengths, input_ids, attention_mask) per batch of :func:`batch_plan`."""
    records = [(label, seq[:truncation]) for label, seq in records]
    for batch in batch_plan([len(seq) for _, seq in records]):
        chunk = [records[i] for i in batch]
        enc = tokenizer([seq for _, seq in chunk], padding=True, return_tensors="pt")
        yield [label for label, _ in chunk], [len(seq) for _, seq in chunk], enc["input_ids"], enc["attention_mask"]


def eager_forward(model):
    def forward(ids, mask):
        return model(input_ids=ids, attention_mask=mask).last_hidden_state
    return forward


def onnx_forward(path):
    from ptq_protein.interop.onnx_export import ort_session

    threads = int(os.environ.get("OMP_NUM_THREADS", "0")) or None
    session = ort_session(path, threads)
    names = [o.name for o in session.get_outputs()]

    def forward(ids, mask):
        out = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        return torch.from_numpy(out[names.index("last_hidden_state")])
    return forward


class _LastHidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def pt2e_forward(model, tokenizer, calib_fasta):
    """torchao PT2E static W8A8 (X86InductorQuantizer on every Linear), compiled by inductor with freezing."""
    import torch._inductor.config as inductor_config
    from torch.export import Dim, export
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    calib = list(batches_of(read_fasta(calib_fasta), tokenizer))
    _, _, ids, mask = calib[0]
    batch, length = Dim("batch", min=1, max=4096), Dim("length", min=3, max=1024)
    started = time.perf_counter()
    with torch.no_grad():
        graph = export(_LastHidden(model).eval(), (ids, mask), dynamic_shapes=({0: batch, 1: length},) * 2,
                       strict=False).module()
        quantizer = xiq.X86InductorQuantizer()
        quantizer.set_module_type_qconfig(torch.nn.Linear, xiq.get_default_x86_inductor_quantization_config())
        prepared = prepare_pt2e(graph, quantizer)
        for _, _, ids, mask in calib:
            prepared(ids, mask)
        converted = convert_pt2e(prepared)
    inductor_config.freezing = True
    compiled = torch.compile(converted, dynamic=True)
    print(f"pt2e: exported, calibrated on {len(calib)} batches and converted in {time.perf_counter() - started:.1f} s")
    return compiled


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Hugging Face ESM-2 folder (config, weights, vocabulary)")
    parser.add_argument("fasta", type=pathlib.Path)
    parser.add_argument("output_dir", type=pathlib.Path)
    engine = parser.add_mutually_exclusive_group()
    engine.add_argument("--bf16", action="store_true", help="model.to(torch.bfloat16)")
    engine.add_argument("--onnx", type=pathlib.Path, help="run this ONNX export in ONNX Runtime instead")
    engine.add_argument("--pt2e", type=pathlib.Path, metavar="CALIB_FASTA",
                        help="torchao PT2E static W8A8 + torch.compile, calibrated on these sequences")
    args = parser.parse_args(argv)

    from transformers import EsmModel, EsmTokenizer

    tokenizer = EsmTokenizer.from_pretrained(args.model)
    layers = None
    if args.onnx:
        from transformers import EsmConfig

        layers = EsmConfig.from_pretrained(args.model).num_hidden_layers
        forward = onnx_forward(args.onnx)
    else:
        model = EsmModel.from_pretrained(args.model, attn_implementation="sdpa", add_pooling_layer=False).eval()
        layers = model.config.num_hidden_layers
        if args.bf16:
            model = model.to(torch.bfloat16)
        forward = pt2e_forward(model, tokenizer, args.pt2e) if args.pt2e else eager_forward(model)
    embed_fasta(args.fasta, tokenizer, forward, layers, args.output_dir)


def embed_fasta(fasta, tokenizer, forward, layers, output_dir):
    """The loop every engine shares: :func:`batches_of`, ``forward(ids, mask)`` (a (batch, length, D) tensor), and
    per sequence ``LABEL.pt`` with the mean over its residues (BOS/EOS and padding left out), under key ``layers``."""
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        for labels, lengths, ids, mask in batches_of(read_fasta(fasta), tokenizer):
            hidden = forward(ids, mask)
            for i, (label, n) in enumerate(zip(labels, lengths)):
                mean = hidden[i, 1:n + 1].float().mean(0).clone()
                torch.save({"label": label, "mean_representations": {layers: mean}}, output_dir / f"{label}.pt")


if __name__ == "__main__":
    main()
