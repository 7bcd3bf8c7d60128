"""The record of one gpu_check run: steps, results and goals, rewritten as JSON and markdown after every step.

A run that is cut short (time budget, out of memory, a killed process) still
leaves the numbers of every step that finished. Goals are judged only from
measurements taken on a GPU; otherwise they say why they were not judged.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench.common import markdown_table  # noqa: E402  (sibling script: the table helper)
from bench.kernels import GOAL_E2E_MEMORY, GOAL_E2E_TIME, GOAL_VS_BF16, LARGE_M  # noqa: E402  (the goals)

SCHEMA = 1
JSON_NAME = "gpu_check.json"
MARKDOWN_NAME = "gpu_check.md"
NO_GPU = "not judged (no GPU)"
GOAL_MODEL = "ESM-2 3B"


class Record:
    """Everything a run measured so far; :meth:`save` writes ``gpu_check.json`` and ``gpu_check.md`` under ``out``."""

    def __init__(self, out: Path, mode: str, command: str, budget_s: float) -> None:
        self.out = out
        self.start = time.perf_counter()
        self.data: Dict[str, Any] = {
            "schema": SCHEMA, "mode": mode, "command": command, "budget_s": budget_s,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "elapsed_s": 0.0,
            "finished": False, "environment": {}, "steps": [], "kernels": [], "e2e": [], "goals": [],
        }

    @property
    def gpu(self) -> bool:
        return self.data["mode"] == "gpu"

    def step(self, name: str, status: str, seconds: float = 0.0, detail: Optional[str] = None) -> None:
        """One line of the step log: ``status`` "done", "skipped: why" or "failed: why"; ``detail``: a traceback."""
        entry = {"step": name, "status": status, "seconds": round(seconds, 2)}
        if detail is not None:
            entry["traceback"] = detail
        self.data["steps"].append(entry)
        self.save()

    def save(self) -> None:
        """Judge the goals and rewrite both files (each through a temporary file, so a reader never sees half)."""
        self.data["elapsed_s"] = round(time.perf_counter() - self.start, 1)
        self.data["goals"] = judge_goals(self.data)
        self.out.mkdir(parents=True, exist_ok=True)
        _write(self.out / JSON_NAME, json.dumps(self.data, indent=1, default=str) + "\n")
        _write(self.out / MARKDOWN_NAME, markdown(self.data))


def judge_goals(data: dict) -> List[dict]:
    """The issue's goals: W8A8 GEMM vs cuBLAS bf16 at the 3B shapes; int8 ESM-2 3B end to end vs bf16."""
    gemm = [r["ms"]["bf16"] / r["ms"]["w8a8"] for r in data["kernels"]
            if r["model"] == GOAL_MODEL and r["m"] >= LARGE_M and _numbers(r.get("ms", {}), "bf16", "w8a8")]
    e2e = next((r for r in data["e2e"] if r["model"] == GOAL_MODEL and r["recipe"] == "w8a8-uniform"
                and r.get("status") == "done"), None)
    time_ratio = mem_ratio = None
    if e2e is not None:
        time_ratio = _ratio(e2e.get("int8_ms"), e2e.get("baseline_ms"))
        mem_ratio = _ratio(e2e.get("int8_weights_gib"), e2e.get("baseline_weights_gib"))
    rows = [
        (f"W8A8 GEMM speed-up over cuBLAS bf16 ({GOAL_MODEL} shapes, M >= {LARGE_M}, median)",
         statistics.median(gemm) if gemm else None, ">=", GOAL_VS_BF16, "no 3B GEMM timed"),
        (f"int8 (w8a8-uniform) {GOAL_MODEL} forward time / bf16", time_ratio, "<=", GOAL_E2E_TIME,
         "3B end to end not run (pass --e2e-3b)"),
        (f"int8 (w8a8-uniform) {GOAL_MODEL} weight memory / bf16", mem_ratio, "<=", GOAL_E2E_MEMORY,
         "3B end to end not run (pass --e2e-3b)"),
    ]
    goals = []
    for name, value, op, target, missing in rows:
        if data["mode"] != "gpu":
            verdict = NO_GPU
        elif value is None:
            verdict = f"not judged ({missing})"
        else:
            verdict = "met" if (value >= target if op == ">=" else value <= target) else "not met"
        goals.append({"goal": name, "target": f"{op} {target}", "measured": value, "verdict": verdict})
    return goals


def markdown(data: dict) -> str:
    """The whole record as markdown: environment, steps, kernel exactness and timing, end to end, goals."""
    env = data["environment"]
    parts = [f"# gpu_check ({data['mode']})", "",
             f"`{data['command']}`; started {data['started_utc']}, {data['elapsed_s']} s of a "
             f"{data['budget_s']} s budget{'' if data['finished'] else '; not finished (yet, or cut short)'}.", ""]
    parts += [f"- {key}: {value}" for key, value in env.items() if key != "cpu_flags"]
    if not data["mode"] == "gpu":
        parts += ["", "Interpreter run (TRITON_INTERPRET=1): correctness only; its times say nothing about speed."]
    parts += ["", "## Steps", "", markdown_table(("step", "status", "s"), [
        (s["step"], s["status"], s["seconds"]) for s in data["steps"]])]
    parts += ["", "## Kernels: exact against the integer reference", "", _exact_table(data["kernels"])]
    parts += ["", "## Kernels: median ms", "", _timing_table(data["kernels"])]
    parts += ["", "## End to end: int8 (Triton) vs fake", "", _e2e_table(data["e2e"])]
    parts += ["", "## Goals", "", markdown_table(("goal", "target", "measured", "verdict"), [
        (g["goal"], g["target"], "-" if g["measured"] is None else g["measured"], g["verdict"])
        for g in data["goals"]])]
    return "\n".join(parts) + "\n"


def _exact_table(rows: List[dict]) -> str:
    names = sorted({k for r in rows for k in r.get("exact", {})})
    body = [(r["model"], r["layer"], r["m"], r["k"], r["n"],
             *(_yes_no(r.get("exact", {}).get(k, "-")) for k in names), _fmt(r.get("fp8_max_rel_err")))
            for r in rows]
    return markdown_table(("model", "layer", "M", "K", "N", *names, "fp8 max rel err"), body)


def _timing_table(rows: List[dict]) -> str:
    impls = [k for k in ("bf16", "fp16", "int_mm", "w8a8", "w8a8+quant", "pwlq", "w4a8", "fp8")
             if any(k in r.get("ms", {}) for r in rows)]
    body = []
    for r in rows:
        ms = r.get("ms", {})
        body.append((r["model"], r["layer"], r["m"], r["k"], r["n"], *(_fmt(ms.get(k, "-")) for k in impls),
                     _fmt(_ratio(ms.get("bf16"), ms.get("w8a8"))), _fmt(_ratio(ms.get("fp16"), ms.get("w8a8")))))
    return markdown_table(("model", "layer", "M", "K", "N", *impls, "W8A8 speed-up vs bf16", "vs fp16"), body)


_E2E_COLUMNS = (("model", "model"), ("recipe", "recipe"), ("status", "status"), ("engine", "engine"),
                ("max abs err", "max_abs_err"), ("rel err", "rel_err"), ("argmax agree", "argmax_agreement"),
                ("TM vs fake", "tm_vs_fake"), ("baseline", "baseline"), ("baseline ms", "baseline_ms"),
                ("int8 ms", "int8_ms"), ("time ratio", "time_ratio"), ("baseline weights GiB", "baseline_weights_gib"),
                ("int8 weights GiB", "int8_weights_gib"), ("baseline peak GiB", "baseline_peak_gib"),
                ("int8 peak GiB", "int8_peak_gib"))


def _e2e_table(rows: List[dict]) -> str:
    body = []
    for r in rows:
        row = dict(r, time_ratio=_ratio(r.get("int8_ms"), r.get("baseline_ms")))
        body.append(tuple(_fmt(row.get(key, "-")) for _, key in _E2E_COLUMNS))
    return markdown_table(tuple(head for head, _ in _E2E_COLUMNS), body)


def _numbers(d: dict, *keys: str) -> bool:
    return all(isinstance(d.get(k), float) for k in keys)


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    ok = isinstance(num, (int, float)) and isinstance(den, (int, float)) and den
    return num / den if ok else None


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _yes_no(value: Any) -> str:
    return {True: "yes", False: "NO"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
