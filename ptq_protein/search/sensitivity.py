"""Per-unit sensitivity: quantize one unit at a time (the rest FP) and measure a protein metric vs FP.

Calibration runs once (:class:`~ptq_protein.search.workbench.Workbench`); each
unit then costs one module swap and one pass over the sequences. With
``complement=True`` each unit is also measured the other way round (everything
quantized except that unit). Rows are saved after every unit in
``progress.csv`` beside a ``run.json`` of the settings, so an interrupted run
resumes where it stopped; ``sensitivity.csv``, ``summary.md`` and
``sensitivity.png`` are written (atomically) at the end.
"""

from __future__ import annotations

import csv
import io
import logging
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from torch import nn

from ptq_protein.api import crop_sequence, resolve_calibration
from ptq_protein.eval.bench.results_store import INPUTS_KEY, ResultsStore, check_run_info
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.fingerprint import model_fingerprint
from ptq_protein.passes.float_source import require_float
from ptq_protein.passes.sequences import with_input_digests
from ptq_protein.passes.site_report import asymmetry
from ptq_protein.recipes.config import QuantConfig
from ptq_protein.recipes.presets import resolve_config
from ptq_protein.search.metrics import METRIC_VALUES, Metric, Scorer, choose_metric
from ptq_protein.search.plot import plot_sensitivity
from ptq_protein.search.units import Unit, UnitKind, make_units
from ptq_protein.search.workbench import Workbench
from ptq_protein.support.io_utils import atomic_write_text

__all__ = ["sensitivity", "COLUMNS", "unit_stats"]

log = logging.getLogger(__name__)

COLUMNS = ("unit", "kind", "layer", "part", "sites", "metric", "value", "delta_vs_fp", "loss", "top1",
           "complement_loss", "act_min", "act_max", "asymmetry", "kurtosis")
_STORE_COLUMNS = ("target", "recipe", "status") + COLUMNS[1:]
SUMMARY_TOP = 10


def sensitivity(model: nn.Module, recipe: Union[str, QuantConfig, dict] = "w8a8-pwlq",
                sequences: Any = "cameo139:5", *, metric: Optional[Union[str, Metric]] = None,
                unit: Union[str, UnitKind] = "site", out_dir: Optional[Union[str, Path]] = None,
                calibration: Any = "casp14:50", complement: bool = False, batch_size: Optional[int] = None,
                num_recycles: Optional[int] = None, max_length: Optional[int] = None,
                workbench: Optional[Workbench] = None, model_info: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Rank units by how much quantizing them alone moves `metric` away from the FP model.

    Parameters
    ----------
    model
        ESM-2 / ESMFold model (not modified).
    recipe
        Preset name or config giving each unit's precision (its kinds/groups/globs give the scope).
    sequences
        The sequences the metric is measured on (set spec, FASTA path or list).
    metric
        `tm` (ESMFold), `contacts` (both), `logits` (ESM-2 LMs); None: the family's
        (`tm` for ESMFold, `logits` for language models).
    unit
        `site`, `layer` or `part`.
    out_dir
        Where to write `sensitivity.csv`, `summary.md`, `sensitivity.png` (None: nothing written).
    calibration, batch_size, num_recycles
        As for `ptq_protein.quantize`.
    max_length
        Crop calibration and metric sequences to their central window of this many residues.
    workbench
        Reuse an existing calibrated `Workbench` (its scope must match `recipe`).
    model_info
        How the model was made (name, source, sha256, seed), recorded in `run.json` beside a
        fingerprint of its weights, so a resumed run made by another model is refused.

    Returns
    -------
    dict
        `rows` (highest loss first), `timing` and, with `out_dir`, the output `paths`.
    """
    config = resolve_config(recipe)
    adapter = get_adapter(model)
    require_float(model)
    metric = choose_metric(adapter.family, metric)
    unit = UnitKind(unit)
    seq_name, seqs = resolve_calibration(sequences)
    seqs = [crop_sequence(s, max_length) for s in seqs]
    identity = {"model": dict(model_info or {}), "model_fingerprint": model_fingerprint(model),
                "calibration_batch_size": adapter.batch_size(batch_size), "max_length": max_length}
    identity = with_input_digests(identity, {"calibration": calibration, "sequences": sequences}, INPUTS_KEY)
    store = _open_store(out_dir, config, seq_name, seqs, metric, unit, calibration, complement, num_recycles,
                        identity)
    start = time.perf_counter()
    bench = workbench or Workbench(model, config, calibration, batch_size=batch_size, num_recycles=num_recycles,
                                   calib_max_length=max_length)
    calibrated = time.perf_counter()
    scorer = Scorer(bench.model, bench.adapter, metric, seqs, bench.forward_kwargs)
    referenced = time.perf_counter()
    units = make_units(bench.sites, unit)
    rows = [_measure(bench, scorer, config, u, units, complement, store) for u in units]
    rows.sort(key=lambda r: -float(r["loss"]))
    timing = {"calibrate_s": calibrated - start, "fp_pass_s": referenced - calibrated,
              "units_s": time.perf_counter() - referenced, "units": len(units), "sequences": len(seqs)}
    result: Dict[str, Any] = {"rows": rows, "timing": timing}
    if out_dir is not None:
        result["paths"] = _write_outputs(Path(out_dir), rows, config, metric, unit, seq_name, timing)
    return result


def unit_stats(bench: Workbench, u: Unit) -> Dict[str, float]:
    """Calibrated range of the unit's inputs: min, max, asymmetry of that range, largest kurtosis."""
    stats = [st for s in u.site_names if (st := bench.stats.get(s)) is not None and st.count]
    if not stats:
        return {}
    lo = min(float(st.moments.min_val) for st in stats)
    hi = max(float(st.moments.max_val) for st in stats)
    return {"act_min": lo, "act_max": hi, "asymmetry": asymmetry(lo, hi),
            "kurtosis": max(float(st.moments.kurtosis) for st in stats)}


def _measure(bench: Workbench, scorer: Scorer, config: QuantConfig, u: Unit, units: Sequence[Unit],
             complement: bool, store: Optional[ResultsStore]) -> Dict[str, Any]:
    if store is not None and store.is_done(config.name, u.name):
        row = store.get(config.name, u.name)
        return {"unit": u.name, **{c: row[c] for c in COLUMNS[1:]}}
    with bench.applied(bench.recipe_specs(config, u.site_names)) as model:
        values = scorer.score(model)
    main = next(iter(METRIC_VALUES[scorer.metric]))
    row: Dict[str, Any] = {"unit": u.name, "kind": u.kind, "layer": u.layer, "part": u.part, "sites": len(u.sites),
                           "metric": main, "value": values[main],
                           "delta_vs_fp": values[main] - (0.0 if scorer.metric is Metric.LOGITS else 1.0),
                           "loss": scorer.loss(values), "top1": values.get("top1"), **unit_stats(bench, u)}
    if complement:
        rest = [n for other in units if other is not u for n in other.site_names]
        with bench.applied(bench.recipe_specs(config, rest)) as model:
            row["complement_loss"] = scorer.loss(scorer.score(model))
    if store is not None:
        store.put({"target": u.name, "recipe": config.name, "status": "ok", **{c: row.get(c) for c in COLUMNS[1:]}})
    log.info("unit %s: %s %.4g", u.name, main, values[main])
    return row


def _open_store(out_dir, config: QuantConfig, seq_name: str, seqs: Sequence[str], metric: Metric, unit: UnitKind,
                calibration, complement: bool, num_recycles, identity: Dict[str, Any]) -> Optional[ResultsStore]:
    if out_dir is None:
        return None
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file; give a folder")
    calib = calibration if isinstance(calibration, (str, Path)) else f"{len(calibration)} sequences"
    info = {"command": "sensitivity", "recipe": config.to_dict(), "metric": metric.value, "unit": unit.value,
            "sequences": seq_name, "num_sequences": len(seqs), "calibration": str(calib),
            "complement": complement, "num_recycles": num_recycles, **identity}
    out.mkdir(parents=True, exist_ok=True)
    check_run_info(out, info)
    return ResultsStore(out / "progress.csv", _STORE_COLUMNS, text_columns=("kind", "part", "metric"))


def _write_outputs(out: Path, rows: List[Dict[str, Any]], config: QuantConfig, metric: Metric, unit: UnitKind,
                   seq_name: str, timing: Dict[str, Any]) -> Dict[str, Optional[Path]]:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=("rank",) + COLUMNS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for rank, row in enumerate(rows, 1):
        writer.writerow({"rank": rank, **{c: _cell(row.get(c)) for c in COLUMNS}})
    atomic_write_text(out / "sensitivity.csv", buffer.getvalue())
    atomic_write_text(out / "summary.md", _summary(rows, config, metric, unit, seq_name, timing))
    png = plot_sensitivity(rows, out / "sensitivity.png", title=f"{config.name}: {metric.value} loss per {unit.value}")
    return {"csv": out / "sensitivity.csv", "summary": out / "summary.md", "plot": png}


def _cell(value: Any) -> str:
    if value is None or value == "":
        return ""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return str(int(number)) if isinstance(value, int) else f"{number:.6g}"


def _summary(rows, config: QuantConfig, metric: Metric, unit: UnitKind, seq_name: str, timing) -> str:
    lines = [f"# Sensitivity: {config.name}, metric {metric.value}, unit {unit.value}", "",
             f"Each unit quantized alone with `{config.name}` (everything else floating point), measured on "
             f"`{seq_name}` ({timing['sequences']} sequences) against the FP model's own outputs. Loss: "
             + ("relative error of the logits" if metric is Metric.LOGITS else f"1 - {metric.value}") + ".", "",
             f"{timing['units']} units; calibration {timing['calibrate_s']:.1f} s (once), FP pass "
             f"{timing['fp_pass_s']:.1f} s, units {timing['units_s']:.1f} s.", "",
             f"## Top {min(SUMMARY_TOP, len(rows))} units", "",
             "| rank | unit | kind | part | loss | act min | act max | asymmetry | kurtosis |",
             "|---|" * 1 + "---|" * 8]
    for rank, row in enumerate(rows[:SUMMARY_TOP], 1):
        cells = [row["unit"], row["kind"], row["part"]] + [_cell(row.get(c)) for c in
                                                           ("loss", "act_min", "act_max", "asymmetry", "kurtosis")]
        lines.append(f"| {rank} | " + " | ".join(str(c) for c in cells) + " |")
    by_part: Dict[str, float] = {}
    for row in rows:
        by_part[row["part"]] = by_part.get(row["part"], 0.0) + float(row["loss"])
    lines += ["", "## Summed loss by model part", "", "| part | summed loss |", "|---|---|"]
    lines += [f"| {p} | {_cell(v)} |" for p, v in sorted(by_part.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines) + "\n"
