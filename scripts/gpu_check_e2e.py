"""gpu_check step 3: whole models quantized with ``backend="int8"`` (Triton) against ``backend="fake"``.

Per model (random weights in the real fair-esm / transformers classes, from
:mod:`ptq_protein.models.tiny`) one baseline (ESM-2: a bf16 copy; ESMFold:
the float32 model, whose structure module runs in float32) and, per recipe,
the fake model's outputs against the int8 model's (float32 activations, so
only the integer GEMMs differ): max abs / relative error and argmax agreement
of the logits, or of ESMFold's final atom positions and the TM-score of its
CA atoms against the fake model's. On CUDA the int8 model is then cast to the
baseline's dtype (quantizer scales stay float32) and timed
(``bench_kernels.bench_ms``), with its resident weights (the growth of
``torch.cuda.memory_allocated`` from building it, caches of the first forward
included) and the peak of one forward on top of them. On CPU (Triton's
interpreter) nothing is timed: those times would say nothing about speed.
"""

from __future__ import annotations

import copy
import gc
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench.common import ModelShape, build_esm2, random_sequences  # noqa: E402  (sibling scripts: shapes, models)
from bench.kernels import bench_ms  # noqa: E402

RECIPES = ("w8a8-uniform", "w8a8-pwlq", "w4a8-pwlq")
_GIB = 2**30
_CALIBRATION_SEQS = 4


@dataclass(frozen=True)
class E2EModel:
    """One end-to-end model: its name in the record, how to build it (on CPU, float32), batch and baseline dtype."""

    name: str
    build: Callable[[], torch.nn.Module]
    batch: int
    length: int
    baseline_dtype: torch.dtype
    recipes: Tuple[str, ...] = RECIPES

    @property
    def structure(self) -> bool:
        return self.baseline_dtype is torch.float32


def esm2_model(name: str, shape: ModelShape, batch: int) -> E2EModel:
    """A fair-esm ESM-2 of ``shape`` (seeded random weights, demo outlier channels), baseline bf16."""
    return E2EModel(name, lambda: build_esm2(shape)[0], batch, shape.seq_len, torch.bfloat16)


def esmfold_model(length: int, recipes: Tuple[str, ...] = RECIPES) -> E2EModel:
    """The tiny transformers ESMFold, one chain; baseline float32 (its structure module does not run in bf16)."""
    from ptq_protein.models.tiny import tiny_esmfold

    return E2EModel("tiny ESMFold", lambda: tiny_esmfold(0)[0], 1, length, torch.float32, recipes)


class ModelRun:
    """One model on ``device``: its float32 master, evaluation batch, calibration set and baseline numbers."""

    def __init__(self, spec: E2EModel, device: torch.device) -> None:
        from ptq_protein.models.adapters import get_adapter

        self.spec, self.device, self.cuda = spec, device, device.type == "cuda"
        self.master = spec.build().to(device).eval()
        self.adapter = get_adapter(self.master)
        self.sequences = random_sequences(spec.batch, spec.length, seed=2)
        self.calibration = random_sequences(_CALIBRATION_SEQS, spec.length, seed=1)
        self.batch = self.adapter.make_batch(self.sequences)
        self.baseline: dict = {}

    def forward(self, model) -> torch.Tensor:
        """Main output (logits, or ESMFold's final atom14 positions) of one forward on the evaluation batch."""
        from ptq_protein.eval.bench.fidelity import main_output

        with torch.inference_mode():
            return main_output(self.adapter.forward(model, self.batch)).float()

    def measure_baseline(self) -> dict:
        """Agreement with the float32 master of the master cast to the baseline dtype; on CUDA its time and memory."""
        before = _allocated(self.cuda)
        model = copy.deepcopy(self.master).to(self.spec.baseline_dtype)
        rel = _agreement(self.forward(self.master), self.forward(model), self.spec)["rel_err"]
        ms, extra = self._timed(model)
        weights = _growth(before, self.cuda)
        del model
        _release(self.cuda)
        self.baseline = {"baseline": str(self.spec.baseline_dtype).replace("torch.", ""), "baseline_ms": ms,
                         "baseline_weights_gib": weights, "baseline_peak_gib": _plus(weights, extra),
                         "baseline_rel_err_vs_fp32": rel}
        return self.baseline

    def measure_recipe(self, recipe: str) -> dict:
        """Fake vs int8 outputs of ``recipe``; on CUDA the int8 model's time and memory in the baseline dtype."""
        import ptq_protein as pp

        fake = pp.quantize(self.master, recipe, calibration=self.calibration)
        out_fake = self.forward(fake)
        del fake
        _release(self.cuda)
        before = _allocated(self.cuda)
        qmodel = pp.set_engine(pp.quantize(self.master, recipe, calibration=self.calibration, backend="int8"),
                               "reference")  # the kernels' wrappers: Triton on CUDA and under TRITON_INTERPRET
        row = {"model": self.spec.name, "recipe": recipe, **self.baseline}
        row.update(_agreement(out_fake, self.forward(qmodel), self.spec))
        row["engine"] = pp.engine_used(qmodel)
        if self.cuda:  # the interpreter's times say nothing: a CPU smoke run skips these forwards
            if not self.spec.structure:
                qmodel.to(self.spec.baseline_dtype)
                row["int8_rel_err_in_baseline_dtype"] = _agreement(out_fake, self.forward(qmodel), self.spec)["rel_err"]
            row["int8_ms"], extra = self._timed(qmodel)
            row["int8_weights_gib"] = _growth(before, self.cuda)
            row["int8_peak_gib"] = _plus(row["int8_weights_gib"], extra)
        del qmodel
        _release(self.cuda)
        return row

    def close(self) -> None:
        del self.master
        _release(self.cuda)

    def _timed(self, model) -> tuple:
        """(median forward ms, GiB one forward allocates above what was resident); (None, None) on CPU."""
        if not self.cuda:
            return None, None
        self.forward(model)  # warm-up: autotuning, compilation, weight caches
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        self.forward(model)
        torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - start) / _GIB  # before do_bench's L2-flush buffer
        with torch.inference_mode():
            ms = bench_ms(lambda: self.adapter.forward(model, self.batch), cuda=True)
        return ms, extra


def _agreement(reference: torch.Tensor, other: torch.Tensor, spec: E2EModel) -> dict:
    """Max abs and relative error; the share of logits with the same argmax, or the TM-score of the CA atoms."""
    from ptq_protein.eval.bench.fidelity import relative_error

    out = {"max_abs_err": float((reference - other).abs().max()), "rel_err": relative_error(reference, other)}
    if spec.structure:  # final atom14 positions [batch, L, 14, 3]; atom 1 is CA; one chain
        from ptq_protein.eval.tmscore import tm_score

        ca = [t[0, :, 1].double().cpu().numpy() for t in (other, reference)]
        out["tm_vs_fake"] = tm_score(*ca).tm_score
    else:
        out["argmax_agreement"] = float((reference.argmax(-1) == other.argmax(-1)).double().mean())
    return out


def _allocated(cuda: bool) -> Optional[int]:
    if not cuda:
        return None
    _release(cuda)
    return torch.cuda.memory_allocated()


def _growth(before: Optional[int], cuda: bool) -> Optional[float]:
    return None if before is None else (_allocated(cuda) - before) / _GIB


def _plus(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else a + b


def _release(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
