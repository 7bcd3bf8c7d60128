"""The loop shared by ``eval structure`` and ``eval contacts``: recipes x targets, resumable.

For each recipe (``fp`` first): skip it entirely when every target already has
a done row; otherwise quantize the float model once (calibrating on the
calibration set) and evaluate each pending target, saving its row as soon as
it is finished (:class:`~ptq_protein.eval.bench.results_store.ResultsStore`). Targets
longer than the length cap get a ``skipped: length N > cap M`` row instead of
failing the run; a target whose evaluation raises a ``RuntimeError`` or
``ValueError`` (out of memory, an unreadable native) gets an ``error: ...`` row,
which a resumed run retries.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from torch import nn

from ptq_protein.data.sets import BenchmarkSet, Target
from ptq_protein.eval.bench.distributed import SINGLE, Ranks
from ptq_protein.eval.bench.results_store import (
    OUTPUT_COLUMNS,
    OUTPUT_DIGEST,
    STATUS_OK,
    ResultsStore,
    check_run_info,
    is_done,
)
from ptq_protein.eval.tmscore import TMNormalize
from ptq_protein.models.adapters import ESM2_MAX_RESIDUES, get_adapter
from ptq_protein.support.digests import file_sha256
from ptq_protein.support.io_utils import check_out_path, folder_lock, safe_stem
from ptq_protein.support.progress import progress as progress_of

__all__ = ["FP_RECIPE", "RunOptions", "normalize_recipes", "run_recipes", "length_status", "prediction_path",
           "open_run"]

logger = logging.getLogger(__name__)

FP_RECIPE = "fp"
_LENGTH_SKIP = "skipped: length "
_COUNT_KINDS = ("ok", "skipped", "error", "resumed")

# evaluate(recipe, model, target) -> the row's metric columns (status/seconds are added here)
EvaluateFn = Callable[[str, nn.Module, Target], Mapping[str, Any]]


@dataclass(frozen=True)
class RunOptions:
    """How to quantize the model and run each target.

    ``calibration`` is a set spec (``"casp14:50"``), a FASTA path or a list of
    sequences, as :func:`ptq_protein.quantize` takes it. ``max_length`` is the
    length cap (targets above it are skipped, not fatal). ``tm_normalize``:
    TM-score/GDT normalised by the native's observed residues (``"native"``) or
    the prediction's full sequence (``"sequence"``, the study's ``TMscore native
    pred``); see :class:`~ptq_protein.eval.tmscore.TMNormalize`.
    """

    calibration: Any = "casp14:50"
    max_length: int = ESM2_MAX_RESIDUES
    batch_size: Optional[int] = None  # None: the model family's default (ModelAdapter.calibration_batch)
    num_recycles: Optional[int] = None
    progress: bool = False
    calib_max_length: Optional[int] = None
    tm_normalize: TMNormalize = TMNormalize.NATIVE

    def __post_init__(self) -> None:
        object.__setattr__(self, "tm_normalize", TMNormalize.parse(self.tm_normalize))
        for name in ("max_length", "batch_size"):
            value = getattr(self, name)
            if value is None and name == "batch_size":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.num_recycles is not None and (not isinstance(self.num_recycles, int) or self.num_recycles < 0):
            raise ValueError(f"num_recycles={self.num_recycles!r} must be a non-negative integer")


def run_identity(model: nn.Module, options: RunOptions) -> Dict[str, Any]:
    """What of ``options`` decides the rows and goes into ``run.json``: the calibration batch size, resolved.

    ``batch_size=None`` means the model family's default, which a release may
    change: the resolved number is recorded, so a resumed run never mixes rows
    of models calibrated differently (a ``run.json`` without it is refused).
    """
    return {"calibration_batch_size": get_adapter(model).batch_size(options.batch_size)}


def normalize_recipes(recipes: Iterable[str]) -> Tuple[str, ...]:
    """Validated preset names, ``fp`` first (added when missing: every recipe is compared with it), no repeats.

    Example: ``"w8a8-pwlq,fp,w8a8-pwlq"`` -> ``("fp", "w8a8-pwlq")``.
    """
    from ptq_protein.recipes.presets import PRESETS

    names = [r.strip() for r in (recipes.split(",") if isinstance(recipes, str) else recipes) if r.strip()]
    unknown = [r for r in names if r not in PRESETS]
    if unknown:
        raise ValueError(f"unknown recipe(s) {unknown}; choose from {', '.join(PRESETS)}")
    ordered = [FP_RECIPE] + [r for r in names if r != FP_RECIPE]
    return tuple(dict.fromkeys(ordered))


def length_status(target: Target, cap: int) -> Optional[str]:
    """``"skipped: length N > cap M"`` for a target over the cap, else None."""
    return f"{_LENGTH_SKIP}{target.length} > cap {cap}" if target.length > cap else None


def run_recipes(model: nn.Module, bench: BenchmarkSet, recipes: Sequence[str], store: ResultsStore,
                evaluate: EvaluateFn, options: RunOptions, ranks: Ranks = SINGLE) -> Dict[str, int]:
    """Evaluate every (recipe, target) not yet done in ``store``; returns counts per status kind.

    Parameters
    ----------
    model : the float model (never modified; each recipe works on a quantized copy).
    bench : the evaluation targets, in the order to run them.
    recipes : preset names, see :func:`normalize_recipes` (``fp`` runs first, so
        later recipes can compare with the FP prediction).
    store : where rows go; rows already done there are not redone.
    evaluate : ``evaluate(recipe, model, target) -> {column: value}`` for one target.
    ranks : the processes sharing the work (see :mod:`~ptq_protein.eval.bench.distributed`);
        the counts returned are then those of all ranks together.
    """
    if ranks.shared:
        return _run_shared(model, bench, recipes, store, evaluate, options, ranks)
    counts = dict.fromkeys(_COUNT_KINDS, 0)
    plan = _pending_plan(bench, recipes, store, options)
    passes = _shared_passes(model, plan, options)
    for recipe, pending in plan.items():
        counts["resumed"] += len(bench.targets) - len(pending)
        if not pending:
            logger.info("%s: all %d targets already done", recipe, len(bench.targets))
        _run_recipe(model, recipe, pending, store, evaluate, options, counts, passes.get(recipe))
    return counts


def _pending_plan(bench: BenchmarkSet, recipes: Sequence[str], store: ResultsStore,
                  options: RunOptions) -> Dict[str, List[Target]]:
    """Each recipe's targets not yet done in ``store``, recipes in run order."""
    return {r: [t for t in bench.targets if _pending(store, r, t, options.max_length)]
            for r in normalize_recipes(recipes)}


def _shared_passes(model: nn.Module, plan: Mapping[str, Sequence[Target]], options: RunOptions) -> Dict[str, Any]:
    """One calibration pass per group of recipes with work left whose statistics agree (see ``calibrate_recipes``).

    The same statistics each recipe would collect alone (tested there), so rows do
    not depend on which recipes share a run; only the number of passes changes.
    """
    todo = [r for r, targets in plan.items() if r != FP_RECIPE
            and any(length_status(t, options.max_length) is None for t in targets)]
    if len(todo) < 2 or options.calibration is None:
        return {}
    from ptq_protein.workflows.shared_calibration import calibrate_recipes

    passes, notes = calibrate_recipes(model, todo, options.calibration, batch_size=options.batch_size,
                                      progress=options.progress, num_recycles=options.num_recycles,
                                      calib_max_length=options.calib_max_length)
    for recipe, reason in notes.items():
        logger.info("%s %s", recipe, reason)
    return passes


def _run_shared(model: nn.Module, bench: BenchmarkSet, recipes: Sequence[str], store: ResultsStore,
                evaluate: EvaluateFn, options: RunOptions, ranks: Ranks) -> Dict[str, int]:
    """The pending pairs planned from one reading of the table, ``fp`` shared first, then the rest; counts summed."""
    store.refresh()
    plan = _pending_plan(bench, recipes, store, options)
    ranks.barrier()  # every rank has planned before any rank writes
    counts = dict.fromkeys(_COUNT_KINDS, 0)
    if ranks.is_main:
        counts["resumed"] = sum(len(bench.targets) - len(p) for p in plan.values())
    _run_recipe(model, FP_RECIPE, ranks.share(plan.pop(FP_RECIPE)), store, evaluate, options, counts)
    ranks.barrier()  # the FP outputs the quantized rows are compared with are all written
    mine = ranks.share([(r, t) for r, targets in plan.items() for t in targets])
    for recipe in plan:
        _run_recipe(model, recipe, [t for r, t in mine if r == recipe], store, evaluate, options, counts)
    ranks.barrier()
    store.refresh()  # every rank's rows, for the summary
    return {kind: sum(c[kind] for c in ranks.gather(counts)) for kind in _COUNT_KINDS}


def _run_recipe(model: nn.Module, recipe: str, pending: Sequence[Target], store: ResultsStore,
                evaluate: EvaluateFn, options: RunOptions, counts: Dict[str, int], statistics: Any = None) -> None:
    """Length-capped targets recorded as skipped; the others run on one quantized copy (made only if needed)."""
    runnable = []
    for target in pending:
        status = length_status(target, options.max_length)
        if status is None:
            runnable.append(target)
            continue
        logger.warning("%s: target %s not run: %s (recorded in the table)", recipe, target.id,
                       status[len("skipped: "):])
        store.put({"target": target.id, "recipe": recipe, "length": target.length, "status": status})
        counts["skipped"] += 1
    if runnable:
        qmodel = _quantized(model, recipe, options, statistics)
        for i, target in enumerate(_progress(runnable, recipe, options.progress), 1):
            outcome = _run_one(qmodel, recipe, target, store, evaluate)
            counts[outcome] += 1
            logger.info("%s: %d/%d %s %s", recipe, i, len(runnable), target.id, outcome)
        del qmodel


@contextlib.contextmanager
def open_run(out_dir: Path, run_info: Mapping[str, Any], columns: Sequence[str],
             ranks: Ranks = SINGLE, required: Sequence[str] = ()) -> Iterator[ResultsStore]:
    """The results table of ``out_dir``, held for one run: a second run into the folder is refused meanwhile.

    Checks ``run.json`` against ``run_info`` (a run that scored nothing may change it); ``required``:
    the columns every ok row holds as a finite number (see :class:`ResultsStore`). With several
    ``ranks``, rank 0 holds the folder and checks; a refusal there ends every rank with the same line.
    """
    if not ranks.shared:
        with _held_run(Path(out_dir), run_info, columns, required) as store:
            yield store
        return
    with contextlib.ExitStack() as stack:
        error = None
        if ranks.is_main:
            try:
                store = stack.enter_context(_held_run(Path(out_dir), run_info, columns, required))
            except (ValueError, OSError) as e:
                error = e
        ranks.agree(error)
        if not ranks.is_main:
            store = ResultsStore(Path(out_dir) / "results.csv", columns, required=required)
        yield store


@contextlib.contextmanager
def _held_run(out_dir: Path, run_info: Mapping[str, Any], columns: Sequence[str],
              required: Sequence[str]) -> Iterator[ResultsStore]:
    if not out_dir.is_dir():
        check_out_path(out_dir, what="output folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    with folder_lock(out_dir):
        store = ResultsStore(out_dir / "results.csv", columns, required=required)
        check_run_info(out_dir, run_info, scored=any(is_done(row) for row in store))
        yield store


def prediction_path(out_dir: Path, kind: str, recipe: str, target_id: str, suffix: str) -> Path:
    """``OUT/<kind>/<recipe>/<stem><suffix>``; distinct ids get distinct stems.

    See :func:`~ptq_protein.support.io_utils.safe_stem`.
    """
    return Path(out_dir) / kind / recipe / f"{safe_stem(target_id)}{suffix}"


def _pending(store: ResultsStore, recipe: str, target: Target, cap: int) -> bool:
    """Not done yet, skipped by a smaller length cap than this run's, or its recorded output file is gone, or
    differs from the digest recorded with it (damaged, or another run's file copied in)."""
    row = store.get(recipe, target.id)
    if row is None or not store.is_done(recipe, target.id):
        return True
    output = next((row[c] for c in OUTPUT_COLUMNS if row.get(c)), None)
    if output and row["status"] == STATUS_OK:
        if not _inside(store.path.parent, output):
            logger.warning("%s: output %s of target %s is missing (or not a file inside the folder); redoing it",
                           recipe, output, target.id)
            return True
        if row.get(OUTPUT_DIGEST) and file_sha256(store.path.parent / output) != row[OUTPUT_DIGEST]:
            logger.warning("%s: output %s of target %s differs from the file this row was computed with (damaged "
                           "or replaced); redoing it", recipe, output, target.id)
            return True
    return row["status"].startswith(_LENGTH_SKIP) and target.length <= cap


def _inside(folder: Path, cell: str) -> bool:
    """True when ``cell`` names a regular file inside ``folder`` (a row pointing at ``/etc/hostname`` is not done)."""
    root = folder.resolve()
    path = (root / cell).resolve()
    return path.is_relative_to(root) and path != root and path.is_file()


def _quantized(model: nn.Module, recipe: str, options: RunOptions, statistics: Any = None) -> nn.Module:
    """The float model itself for ``fp`` (no copy: it is never modified), else a quantized copy.

    ``statistics``: a shared calibration pass serving this recipe (None: it calibrates here, if it needs to).
    """
    if recipe == FP_RECIPE:
        return model
    import ptq_protein as pp
    from ptq_protein.nn.qparams import needs_calibration
    from ptq_protein.recipes.presets import resolve_config

    calibrated = needs_calibration(resolve_config(recipe).activations)
    start = time.perf_counter()
    shared = " from the shared pass" if statistics is not None else ""
    logger.info("%s: quantizing%s", recipe,
                f" (calibration: {_describe(options.calibration)}{shared})" if calibrated else "")
    qmodel = pp.quantize(model, recipe, calibration=options.calibration, batch_size=options.batch_size,
                         progress=options.progress, num_recycles=options.num_recycles,
                         calib_max_length=options.calib_max_length, statistics=statistics)
    logger.info("%s: quantized in %.1f s", recipe, time.perf_counter() - start)
    return qmodel


def _run_one(model: nn.Module, recipe: str, target: Target, store: ResultsStore, evaluate: EvaluateFn) -> str:
    start = time.perf_counter()
    base = {"target": target.id, "recipe": recipe, "length": target.length}
    try:
        metrics = dict(evaluate(recipe, model, target))
    except (RuntimeError, ValueError) as e:  # one bad target must not lose a long run
        logger.warning("%s: target %s failed: %s: %s (recorded; retried on resume)", recipe, target.id,
                       type(e).__name__, e)
        store.put({**base, "status": f"error: {type(e).__name__}: {' '.join(str(e).split())[:200]}"})
        return "error"
    output = next((metrics[c] for c in OUTPUT_COLUMNS if metrics.get(c)), None)
    if output and OUTPUT_DIGEST in store.columns:  # what the row was computed with: checked on resume
        metrics[OUTPUT_DIGEST] = file_sha256(store.path.parent / output)
    store.put({**base, **metrics, "status": STATUS_OK, "seconds": time.perf_counter() - start})
    return "ok"


def _progress(targets: Sequence[Target], recipe: str, show: bool) -> Iterable[Target]:
    return progress_of(targets, recipe, "targets", show=show)


def _describe(calibration: Any) -> str:
    if isinstance(calibration, (list, tuple)):
        return f"{len(calibration)} sequences"
    return str(calibration)
