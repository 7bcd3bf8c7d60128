"""The bench models and what the timed rows read: random ESM-2 checkpoints in fair-esm's published layout and the
same weights as a Hugging Face folder (checked equal before any timing), the FASTA files, and artifacts made the
way a user makes them (``ptq-protein quantize``, a whole process, timed on its own).

Random weights (``scripts/make_random_checkpoints.py``): a toolkit measurement, never biology. Files go under
``--dir`` (default /tmp/ptq44_bench, never committed): one folder per outlier shape (:data:`WEIGHTS`,
``ptq_protein.models.outlier_shapes``: ``outliers/`` the residual channels, ``plain/``, ``ln-gain/``, ``sink/``,
``mix/``), each with ``NAME.pt``, ``NAME-contact-regression.pt`` and ``NAME-hf/``.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from bench.common import SCRIPTS, Measured, run_measured, write_fasta

RECIPES = ("w8a8-smoothquant", "w8a8-pwlq", "w8a8-uniform", "w8a8-dynamic")  # the 8-bit presets the benches time
RECOMMENDED = "w8a8-smoothquant"  # docs/embeddings.md's recipe for embeddings: the ONNX, HF-folder and goal rows
KINDS = {"quick": "esm2_quick", "8m": "esm2_8M", "35m": "esm2_35M", "150m": "esm2_150M", "650m": "esm2_650M"}
WEIGHTS = ("outliers", "plain", "ln-gain", "sink", "mix")  # outlier shapes (outliers: the residual channels)
_PLANTED = {"outliers": "planted residual outlier channels", "plain": "no planted outliers",
            "ln-gain": "LayerNorm-gain outlier channels", "sink": "BOS/EOS attention sinks",
            "mix": "residual channels, LayerNorm gains and attention sinks"}
DEFAULT_DIR = Path("/tmp/ptq44_bench")
HF_MATCH = 1e-4  # relative Frobenius difference allowed between the HF folder's and fair-esm's last layer
CALIB_SET, CALIB_COUNT, CALIB_CROP = "casp14", 50, 128  # what `ptq-protein quantize` calibrates on by default (CPU)


@dataclass(frozen=True)
class BenchModel:
    """One random checkpoint: the fair-esm file, its HF folder, and its shape."""

    size: str
    weights: str  # one of WEIGHTS
    checkpoint: Path
    hf_folder: Path
    layers: int
    dim: int
    heads: int

    def describe(self) -> str:
        planted = _PLANTED.get(self.weights, self.weights)
        return (f"random ESM-2 {self.size}-sized checkpoint ({self.layers} layers x {self.dim}, {self.heads} heads, "
                f"{planted}; {self.checkpoint.name} in fair-esm's layout and as an HF folder)")


def cli() -> List[str]:
    """The ``ptq-protein`` command of this interpreter's environment, as a user types it."""
    script = Path(sys.executable).parent / "ptq-protein"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ptq_protein.cli.main"]


def loop_script(name: str) -> str:
    """A stand-alone loop of ``scripts/bench/loops/`` (fair-esm's extract.py and predict.py, the HF loop)."""
    return str(SCRIPTS / "bench" / "loops" / f"{name}.py")


def bench_model(folder: Path, size: str, weights: str, fresh: bool = False) -> BenchModel:
    """The checkpoint of ``size`` under ``folder/weights`` (written when missing or ``fresh``), its HF folder
    checked equal to it."""
    sys.path.insert(0, str(SCRIPTS))
    import make_random_checkpoints as maker

    kind = KINDS[size]
    name, layers, dim, heads = maker.SIZES[kind]
    where = folder / weights
    model = BenchModel(size, weights, where / f"{name}.pt", where / f"{name}-hf", layers, dim, heads)
    if fresh or not (model.checkpoint.exists() and model.hf_folder.exists()):
        if where.exists():
            shutil.rmtree(where)
        where.mkdir(parents=True)
        maker.write_esm2(kind, where, outliers=weights, hf=True)
    check_hf_matches(model)
    return model


def check_hf_matches(model: BenchModel) -> float:
    """The HF folder's ``EsmModel`` (SDPA) against fair-esm's own loader on a padded batch: their last layers'
    relative difference, which must be within :data:`HF_MATCH` (else the two anchors would run different models)."""
    import argparse

    import esm
    import torch
    from transformers import EsmModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the HF folder holds a masked LM: EsmModel's load report lists the head
    hf_logging.disable_progress_bar()
    torch.serialization.add_safe_globals([argparse.Namespace])
    fair, alphabet = esm.pretrained.load_model_and_alphabet_local(str(model.checkpoint))
    hf = EsmModel.from_pretrained(model.hf_folder, attn_implementation="sdpa").eval()
    data = [("a", "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ"), ("b", "MENDELKKLLAAGHRW")]
    _, _, tokens = alphabet.get_batch_converter()(data)
    with torch.no_grad():
        a = fair.eval()(tokens, repr_layers=[model.layers])["representations"][model.layers]
        b = hf(input_ids=tokens, attention_mask=(tokens != alphabet.padding_idx).long()).last_hidden_state
    keep = tokens != alphabet.padding_idx
    diff = float((a[keep] - b[keep]).norm() / a[keep].norm())
    if not diff <= HF_MATCH:
        raise RuntimeError(f"{model.hf_folder}: its last layer differs from {model.checkpoint.name}'s by {diff:.2e} "
                           f"(> {HF_MATCH}); rewrite both with --fresh-model")
    return diff


def calibration_fasta(path: Path) -> Path:
    """The sequences ``ptq-protein quantize`` calibrates on by default (casp14:50, central 128 residues), for the
    anchors that calibrate themselves (torchao PT2E)."""
    from ptq_protein.passes.sequences import calibration_records, crop_sequence

    records = calibration_records(f"{CALIB_SET}:{CALIB_COUNT}")
    return write_fasta(path, [(label, crop_sequence(seq, CALIB_CROP)) for label, seq in records])


def quantize(model_path: Path, recipe: str, out: Path, env: Mapping[str, str], log: Optional[Path] = None) -> Measured:
    """``ptq-protein quantize MODEL --preset RECIPE --out ART``, default options, a whole process.

    ``PRESET@ALPHA`` adds ``--smoothquant-alpha ALPHA`` (a number, or ``auto``)."""
    preset, _, alpha = recipe.partition("@")
    extra = ["--smoothquant-alpha", alpha] if alpha else []
    return run_measured([*cli(), "quantize", str(model_path), "--preset", preset, *extra, "--out", str(out)], env,
                        log=log)


def export_onnx(artifact: Path, out: Path, env: Mapping[str, str], log: Optional[Path] = None) -> Measured:
    """``ptq-protein export ART --format onnx --out FILE``."""
    return run_measured([*cli(), "export", str(artifact), "--format", "onnx", "--out", str(out)], env, log=log)


def artifacts(model_paths: Mapping[str, Path], recipes: Sequence[str], scratch: Path,
              env: Mapping[str, str]) -> Tuple[Dict[Tuple[str, str], Path], Dict[Tuple[str, str], Measured]]:
    """Each (source, recipe) quantized as typed (``source``: a key of ``model_paths``, e.g. checkpoint or HF
    folder): {(source, recipe): artifact folder} for those that succeeded, and every run's measurement."""
    made: Dict[Tuple[str, str], Path] = {}
    runs: Dict[Tuple[str, str], Measured] = {}
    for source, path in model_paths.items():
        for recipe in recipes:
            out = scratch / f"art-{source}-{recipe}"
            log = scratch / f"quantize-{source}-{recipe}.log"
            runs[source, recipe] = done = quantize(path, recipe, out, env, log=log)
            if done.returncode == 0:
                made[source, recipe] = out
    return made, runs


OV_ROWS = {"ov32": "fp32", "ov": "fp32", "ov8": "int8"}  # the OpenVINO rows and the IR each runs


def openvino_absent(int8: bool) -> str:
    """'' when this interpreter imports openvino (and nncf, for ``int8``), else why the OpenVINO row is absent."""
    missing = [name for name in ("openvino", "nncf")[:1 + int8] if not importlib.util.find_spec(name)]
    return f"absent: {' and '.join(missing)} not installed (pip install ptq-protein[openvino])" if missing else ""


def openvino_irs(hf_folder: Path, calib: Path, keys: Sequence[str], scratch: Path, env: Mapping[str, str],
                 calib_seqs: int, alpha: float) -> Tuple[Dict[str, Union[Path, str]], Dict[str, Measured]]:
    """The IRs the OpenVINO rows ``keys`` (of :data:`OV_ROWS`) run, made once as an OpenVINO user makes them
    (``loops/ov_convert.py``: the HF folder converted to an FP32 IR, then NNCF INT8 of it), whole processes:
    {row key: IR, or why the row is absent}, and each run's measurement ("convert", "nncf")."""
    script = [sys.executable, loop_script("ov_convert"), str(hf_folder)]
    irs = {"convert": scratch / "ov" / "fp32.xml", "nncf": scratch / "ov" / "int8.xml"}
    steps = {"convert": [str(irs["convert"])],
             "nncf": [str(irs["nncf"]), "--nncf", str(irs["convert"]), "--calib", str(calib),
                      "--calib-seqs", str(calib_seqs), "--alpha", str(alpha)]}
    runs: Dict[str, Measured] = {}
    found: Dict[str, Union[Path, str]] = {}
    for key in keys:
        needed = ["convert", "nncf"] if OV_ROWS[key] == "int8" else ["convert"]
        why = openvino_absent(len(needed) > 1)
        for step in needed:
            if not why and step not in runs:
                runs[step] = run_measured([*script, *steps[step]], env, log=scratch / f"ov-{step}.log")
            if not why and runs[step].returncode:
                why = f"absent: {step} failed: {runs[step].failure()}"
        found[key] = why or irs[needed[-1]]
    return found, runs
