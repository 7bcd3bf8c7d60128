"""Every preset on random ESM-2 checkpoints (plain, planted outliers; fair-esm and transformers), as users run it.

Toolkit check only: the weights are random (``make_random_checkpoints.py``), so the numbers measure quantization
error, never biology. Each case is one ``ptq-protein quantize CHECKPOINT --preset P --json`` in a fresh process (the
command a user runs: a fair-esm file is memory-mapped and quantized in place), and the table lists its exit code,
its fidelity check (rel. error of the logits, top-1 agreement) and whether it was flagged outside its recipe's bound.
``--compare`` instead runs one ``quantize --compare`` per checkpoint (every preset that applies, from shared
calibration passes, on copies of the model): the same numbers per recipe at a fraction of the time, but not the
in-place path (tests/core/test_low_memory.py checks that the two give the same artifact for every preset).

    python scripts/audit_recipes.py --size esm2_35M --calib casp14:16 --compare --out /tmp/audit45
    python scripts/audit_recipes.py --size esm2_8M --presets w8a8-smoothquant,w8a8-uniform

Results go to ``--out``/results.json (one entry per case, so an interrupted run resumes) and a Markdown table on
stdout. ``--python`` runs the cases under another interpreter or tree (``PYTHONPATH=old/tree``) to compare code
versions on the same checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_random_checkpoints import SIZES, write_esm2  # noqa: E402

SOURCES = ("fair", "fair-outliers", "hf", "hf-outliers")


def checkpoints(size: str, folder: Path, sources: Sequence[str]) -> Dict[str, Path]:
    """The checkpoint of each source (written once under ``folder``: ``plain/`` and ``outliers/``, each holding
    the fair-esm file and the transformers folder of the same weights)."""
    name = SIZES[size][0]
    out = {}
    for source in sources:
        weights = "outliers" if source.endswith("outliers") else "plain"
        where = folder / weights
        if not ((where / f"{name}.pt").exists() and (where / f"{name}-hf").exists()):
            where.mkdir(parents=True, exist_ok=True)
            write_esm2(size, where, outliers=weights == "outliers", hf=True)
        out[source] = where / (f"{name}-hf" if source.startswith("hf") else f"{name}.pt")
    return out


def run_case(python: Sequence[str], model: Path, preset: str, calib: str, out: Path, env: dict) -> dict:
    """One ``quantize --json`` run: exit code, fidelity metrics, the verdict line (stderr), or the refusal."""
    cmd = [*python, "-c", "import sys; from ptq_protein.cli.main import main; sys.exit(main())", "quantize",
           str(model), "--preset", preset, "--calib", calib, "--out", str(out), "--force", "--json", "--quiet",
           "--compare", "none"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    case = {"exit": done.returncode, "stderr": [ln for ln in done.stderr.splitlines() if ln.strip()][-3:]}
    try:
        summary = json.loads(done.stdout)
    except json.JSONDecodeError:
        return case
    case.update(summary.get("fidelity_vs_fp") or {})
    case["verdict"] = summary.get("fidelity_verdict")
    return case


def run_compare(python: Sequence[str], model: Path, presets: Sequence[str], calib: str, out: Path,
                env: dict) -> Dict[str, dict]:
    """One ``quantize --compare`` run over ``presets`` (the first is saved): preset -> its row, as run_case gives."""
    main_preset, *others = presets
    cmd = [*python, "-c", "import sys; from ptq_protein.cli.main import main; sys.exit(main())", "quantize",
           str(model), "--preset", main_preset, "--calib", calib, "--out", str(out), "--force", "--json", "--quiet",
           "--compare", ",".join(others)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    try:
        rows = json.loads(done.stdout)["comparison"]["rows"]
    except (json.JSONDecodeError, KeyError):
        tail = [ln for ln in done.stderr.splitlines() if ln.strip()][-3:]
        return {p: {"exit": done.returncode, "stderr": tail} for p in presets}
    return {row["recipe"]: {"exit": done.returncode, "stderr": [], **row} for row in rows}


def applicable(presets: Sequence[str], model: Path) -> Dict[str, Optional[str]]:
    """preset -> None where it selects sites of ``model`` and can be compared, else why not."""
    from ptq_protein.models.adapters import get_adapter
    from ptq_protein.models.loading import load_model
    from ptq_protein.passes.recipe import resolve_recipe
    from ptq_protein.recipes.presets import get_preset
    from ptq_protein.support.errors import InputError

    loaded = load_model(model)
    adapter = get_adapter(loaded.model)
    out: Dict[str, Optional[str]] = {}
    for name in presets:
        cfg = get_preset(name)
        try:
            resolve_recipe(cfg).choose(loaded.model, adapter, cfg)
            out[name] = "nothing to quantize" if name == "fp" else None
        except InputError as err:
            out[name] = str(err)
    return out


def table(results: Dict[str, dict], presets: Sequence[str], sources: Sequence[str]) -> str:
    head = "| preset | " + " | ".join(f"{s}: rel. err / top-1 / exit" for s in sources) + " |"
    lines = [head, "|" + "---|" * (len(sources) + 1)]
    for preset in presets:
        cells = [_cell(preset, results.get(f"{s}/{preset}")) for s in sources]
        lines.append(f"| {preset} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _verdict(preset: str, case: dict) -> Optional[dict]:
    """The verdict the quantize of today gives these metrics (for results recorded by code without one)."""
    from ptq_protein.recipes.presets import get_preset
    from ptq_protein.workflows.fidelity_bound import recipe_bound, verdict

    return verdict(recipe_bound(get_preset(preset)), {k: v for k, v in case.items() if isinstance(v, float)})


def _cell(preset: str, case: Optional[dict]) -> str:
    if case is None:
        return "not run"
    if "relative_error" not in case:
        why = case["stderr"][-1] if case["stderr"] else "no output"
        return f"exit {case['exit']}: {why[:60]}"
    verdict = case.get("verdict") or _verdict(preset, case) or {}
    flag = " **outside**" if verdict.get("within") is False else ""
    top1 = case.get("top1_agreement")
    top1 = f"{top1:.3f}" if top1 is not None else "-"
    return f"{case['relative_error']:.4f} / {top1} / {case['exit']}{flag}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    from ptq_protein.recipes.presets import PRESETS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="esm2_35M", choices=list(SIZES))
    parser.add_argument("--presets", help="comma-separated (default: every preset)")
    parser.add_argument("--sources", default=",".join(SOURCES), help=f"comma-separated of {', '.join(SOURCES)}")
    parser.add_argument("--calib", default="casp14:50", help="calibration set (the CLI's default: casp14:50)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/audit_recipes"))
    parser.add_argument("--python", default=sys.executable, help="interpreter to run the cases with")
    parser.add_argument("--tag", default="", help="results file suffix (e.g. 'before')")
    parser.add_argument("--compare", action="store_true", help="one quantize --compare per checkpoint")
    args = parser.parse_args(argv)
    presets = args.presets.split(",") if args.presets else list(PRESETS)
    sources = args.sources.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    models = checkpoints(args.size, args.out, sources)
    store = args.out / f"results{'-' + args.tag if args.tag else ''}.json"
    results: Dict[str, dict] = json.loads(store.read_text()) if store.exists() else {}
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for source in sources if args.compare else ():
        if any(f"{source}/{p}" in results for p in presets):
            continue
        why = applicable(presets, models[source])
        for preset, reason in why.items():
            if reason is not None:
                results[f"{source}/{preset}"] = {"exit": None, "stderr": [f"not compared: {reason}"]}
        rows = run_compare(args.python.split(), models[source], [p for p in presets if why[p] is None], args.calib,
                           args.out / "artifact", env)
        results.update({f"{source}/{p}": row for p, row in rows.items()})
        store.write_text(json.dumps(results, indent=1))
        sys.stderr.write(f"{source}: {len(rows)} recipes compared\n")
    for source in () if args.compare else sources:
        for preset in presets:
            key = f"{source}/{preset}"
            if key in results:
                continue
            results[key] = run_case(args.python.split(), models[source], preset, args.calib,
                                    args.out / "artifact", env)
            store.write_text(json.dumps(results, indent=1))
            sys.stderr.write(f"{key}: {_cell(preset, results[key])}\n")
    sys.stdout.write(f"{args.size}, calibration {args.calib}; random weights (toolkit check, not biology)\n\n")
    sys.stdout.write(table(results, presets, sources) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
