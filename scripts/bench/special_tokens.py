#!/usr/bin/env python
"""Error at BOS/EOS and at residue positions under each ``special_tokens`` mode (issue 11).

For each model with planted BOS/EOS outliers (``ptq_protein.models.outliers``:
tiny-esm2, tiny-esm2-hf, tiny-esmfold; random weights, so this checks the toolkit,
not biology), each preset and each mode (``clip``: residue range, BOS/EOS clipped;
``include``: BOS/EOS in the statistics; ``float``: BOS/EOS rows kept in floating
point), it quantizes the model (same calibration sequences), runs held-out
sequences, and reports:

* **site MSE** at BOS/EOS and at residue positions: ``(q(x) - x)^2`` at the input
  of every quantizer of the language model (pooled over sites and positions;
  ``worst`` is the largest single-site BOS/EOS MSE), in the quantized model's own
  forward;
* **output MSE** vs the float model: LMs: final representations at BOS/EOS and at
  residues; ESMFold: the LM stem's last hidden state (same split) and the
  predicted CA positions (Å², residues only).

    python -m scripts.bench special_tokens                       # all models, w8a8-pwlq and w8a8-uniform
    python -m scripts.bench special_tokens --models tiny-esm2 --presets w8a8-uniform   # quick
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import command_line, environment_line, markdown_table  # noqa: E402

MODES = ("clip", "include", "float")
HELD_OUT = "cameo139:6"  # evaluation sequences (calibration uses casp14)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny-esm2,tiny-esm2-hf,tiny-esmfold")
    p.add_argument("--presets", default="w8a8-pwlq,w8a8-uniform")
    p.add_argument("--calib", default="casp14:8", help="calibration set (default casp14:8)")
    p.add_argument("--crop", type=int, default=64, help="crop every sequence to its central N residues (default 64)")
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def _crop(seqs: Sequence[str], n: int) -> List[str]:
    return [s if len(s) <= n else s[(len(s) - n) // 2:(len(s) - n) // 2 + n] for s in seqs]


class SiteErrors:
    """Pooled squared error of every LM quantizer's output, split into BOS/EOS and residue positions."""

    def __init__(self, model: torch.nn.Module, batch):
        from ptq_protein.nn.modules import ActQuantizer

        self.batch, self.handles = batch, []
        self.sums = {"special": [0.0, 0], "residue": [0.0, 0]}
        self.worst = 0.0
        for module in model.modules():
            if isinstance(module, ActQuantizer):
                self.handles.append(module.register_forward_hook(self._hook))

    def _hook(self, module, args, out) -> None:
        from ptq_protein.calibration.masks import align_mask, special_positions

        x, b = args[0].detach().float(), self.batch
        err = (out.detach().float() - x) ** 2
        computed = b.token_mask | b.special_mask
        special = special_positions(x.shape, computed, b.special_mask, module.channel_last)
        residue = align_mask(x.shape, b.token_mask, b.token_mask, module.channel_last)
        if special is None or residue is None:  # not an LM tensor (ESMFold trunk)
            return
        for key, mask in (("special", special), ("residue", residue)):
            rows = mask.expand(*x.shape[:-1], 1).squeeze(-1) if module.channel_last else mask.expand(x.shape)
            values = err[rows]
            self.sums[key][0] += float(values.double().sum())
            self.sums[key][1] += values.numel()
            if key == "special" and values.numel():
                self.worst = max(self.worst, float(values.double().mean()))

    def mse(self, key: str) -> float:
        total, count = self.sums[key]
        return total / max(count, 1)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _outputs(model, adapter, batch) -> Dict[str, torch.Tensor]:
    """(B, T, C) final LM representation, plus ESMFold's CA positions [B, L, 3]."""
    with torch.no_grad():
        if adapter.family == "fair-esm":
            reps = model(batch.inputs["tokens"], repr_layers=[len(model.layers)])["representations"]
            return {"lm": reps[len(model.layers)]}
        if adapter.family == "hf-esm":
            return {"lm": model(**batch.inputs, output_hidden_states=True).hidden_states[-1]}
        out = adapter.forward(model, batch, num_recycles=0)
        return {"ca": out["positions"][-1][..., 1, :]}


def _stem_output(model, adapter, batch) -> torch.Tensor:
    """ESMFold: the LM stem's last hidden state (B, T, C), captured by a hook on its last layer."""
    seen = []
    handle = model.esm.encoder.layer[-1].register_forward_hook(
        lambda m, a, o: seen.append((o[0] if isinstance(o, tuple) else o).detach()))
    try:
        with torch.no_grad():
            adapter.forward(model, batch, num_recycles=0)
    finally:
        handle.remove()
    return seen[-1]


def _masked_mse(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((a.float() - b.float()) ** 2)[mask].double().mean())


RANGES: List[list] = []


def _widest_special(name: str, preset: str, report: Sequence[dict]) -> list:
    """The site whose BOS/EOS values reach furthest: its BOS/EOS range and its calibrated (residue) range."""
    row = max((r for r in report if "special_max" in r), key=lambda r: max(-r["special_min"], r["special_max"]))
    return [name, preset, row["site"], f"[{row['special_min']:.1f}, {row['special_max']:.1f}]",
            f"[{row['min']:.1f}, {row['max']:.1f}]"]


def measure(name: str, preset: str, mode: str, model, adapter, calib, batch, reference) -> list:
    import ptq_protein as pp
    from ptq_protein.recipes.presets import resolve_config

    start = time.perf_counter()
    cfg = resolve_config(preset).replace(special_tokens=mode)
    qmodel = pp.quantize(model, cfg, calibration=calib, num_recycles=0 if adapter.family == "hf-esmfold" else None)
    seconds = time.perf_counter() - start
    errors = SiteErrors(qmodel, batch)
    try:
        out = _outputs(qmodel, adapter, batch)
    finally:
        errors.close()
    if adapter.family == "hf-esmfold":
        lm, lm_ref = _stem_output(qmodel, adapter, batch), reference["stem"]
        tail = _masked_mse(out["ca"], reference["ca"], batch.residue_mask)
    else:
        lm, lm_ref, tail = out["lm"], reference["lm"], float("nan")
    if mode == "clip":
        RANGES.append(_widest_special(name, preset, qmodel.ptq_state.report))
    return [name, preset, mode, errors.mse("special"), errors.worst, errors.mse("residue"),
            _masked_mse(lm, lm_ref, batch.special_mask), _masked_mse(lm, lm_ref, batch.token_mask), tail, seconds]


def main(argv: Sequence[str] = ()) -> int:
    args = parse_args(list(argv))
    torch.set_num_threads(args.threads)
    from ptq_protein.api import resolve_calibration
    from ptq_protein.data.sets import load_set
    from ptq_protein.models.adapters import get_adapter
    from ptq_protein.models.loading import load_model

    calib = _crop(resolve_calibration(args.calib)[1], args.crop)
    held_out = _crop(list(load_set(HELD_OUT).sequences()), args.crop)
    rows = []
    for name in args.models.split(","):
        model = load_model(name).model.eval()
        adapter = get_adapter(model)
        batch = adapter.make_batch(held_out)
        reference = _outputs(model, adapter, batch)
        if adapter.family == "hf-esmfold":
            reference["stem"] = _stem_output(model, adapter, batch)
        for preset in args.presets.split(","):
            for mode in MODES:
                rows.append(measure(name, preset, mode, model, adapter, calib, batch, reference))
                print(f"done {rows[-1][:3]}", file=sys.stderr, flush=True)
    header = ["model", "preset", "BOS/EOS", "site MSE BOS/EOS", "worst site BOS/EOS", "site MSE residues",
              "LM out MSE BOS/EOS", "LM out MSE residues", "CA MSE (Å²)", "quantize s"]
    print(f"`{command_line(argv, __file__)}`; {environment_line(args.threads)}; calibration {args.calib}, "
          f"held-out {HELD_OUT}, both cropped to {args.crop} residues; tiny random models (toolkit check)\n")
    print(markdown_table(header, rows))
    print("\nThe site whose BOS/EOS values reach furthest (calibration statistics of the `clip` run):\n")
    print(markdown_table(["model", "preset", "site", "BOS/EOS range", "residue range"], RANGES))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
