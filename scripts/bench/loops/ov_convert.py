#!/usr/bin/env python3
"""Make the embed bench's OpenVINO models, as an OpenVINO user does (one whole process each, timed by the bench):

* ``ov_convert.py HF_FOLDER OUT.xml``: ``EsmModel`` (SDPA, no pooler) through ``ov.convert_model`` with an example
  batch, inputs ``input_ids`` and ``attention_mask`` of dynamic shape [-1, -1] (any batch, any length), saved
  with ``ov.save_model(..., compress_to_fp16=False)`` (FP32 weights);
* ``ov_convert.py HF_FOLDER OUT.xml --nncf FP32.xml --calib CALIB_FASTA``: NNCF post-training INT8 of that IR,
  ``nncf.quantize(model, nncf.Dataset(...), model_type=nncf.ModelType.TRANSFORMER, subset_size=N)`` on the first
  ``--calib-seqs`` sequences (one per item), SmoothQuant's MatMul alpha ``--alpha`` (NNCF's own default: 0.95).
"""

import argparse
import pathlib

from hf_loop import _LastHidden, read_fasta  # beside this file
from ov_loop import VOCAB, PlainTokenizer

EXAMPLE = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDELKKLLAAGHRW"]  # any two lengths: the shapes are dynamic


def convert(folder, out):
    import openvino as ov
    import torch
    from transformers import EsmModel

    model = EsmModel.from_pretrained(folder, attn_implementation="sdpa", add_pooling_layer=False).eval()
    example = PlainTokenizer(pathlib.Path(folder) / VOCAB)(EXAMPLE)
    with torch.no_grad():
        graph = ov.convert_model(_LastHidden(model), example_input=(example["input_ids"], example["attention_mask"]),
                                 input=[ov.PartialShape([-1, -1])] * 2)
    ov.save_model(graph, out, compress_to_fp16=False)


def quantize(folder, fp32, calib, out, count, alpha):
    import nncf
    import openvino as ov

    tokenizer = PlainTokenizer(pathlib.Path(folder) / VOCAB)
    items = [tokenizer([seq]) for _, seq in read_fasta(calib)[:count]]
    dataset = nncf.Dataset(items, lambda enc: [enc["input_ids"].numpy(), enc["attention_mask"].numpy()])
    advanced = nncf.AdvancedQuantizationParameters(smooth_quant_alphas=nncf.AdvancedSmoothQuantParameters(matmul=alpha))
    model = nncf.quantize(ov.Core().read_model(fp32), dataset, model_type=nncf.ModelType.TRANSFORMER,
                          subset_size=len(items), advanced_parameters=advanced)
    ov.save_model(model, out, compress_to_fp16=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Hugging Face ESM-2 folder (config, weights, vocab.txt)")
    parser.add_argument("out", type=pathlib.Path, help="the IR to write (.xml; its .bin beside it)")
    parser.add_argument("--nncf", type=pathlib.Path, metavar="FP32_XML", help="quantize this FP32 IR to INT8")
    parser.add_argument("--calib", type=pathlib.Path, help="calibration FASTA (with --nncf)")
    parser.add_argument("--calib-seqs", type=int, default=8, help="calibration sequences (default 8)")
    parser.add_argument("--alpha", type=float, default=0.5, help="SmoothQuant alpha on MatMuls (default 0.5)")
    args = parser.parse_args(argv)
    if args.nncf and not args.calib:
        parser.error("--nncf needs --calib CALIB_FASTA")
    if args.nncf:
        quantize(args.model, args.nncf, args.calib, args.out, args.calib_seqs, args.alpha)
    else:
        convert(args.model, args.out)


if __name__ == "__main__":
    main()
