#!/usr/bin/env python
"""Benchmark the int8 kernels on ESM-2 / ESMFold layer shapes, and a W8A8 ESM-2 3B forward.

Prints markdown tables: per GEMM shape the time (``triton.testing.do_bench``,
median ms) and TFLOP/s of torch bf16 (cuBLAS), ``torch._int_mm`` (int32 out),
torch fp16 (cuBLAS), our W8A8 GEMM (fused epilogue, bf16 out), W8A8 with its per-token activation
quantization, the PWLQ GEMM (symmetric 3-region codebook) and W4A8; then peak
GPU memory and forward time of a randomly initialised ESM-2 3B-sized model in
bf16 vs W8A8 (every ``nn.Linear`` in the transformer layers swapped for
``Int8Linear``), and the goals next to the measurements. A failing cell is
printed as ``error: ...`` instead of stopping the run.

    python -m scripts.bench kernels            # on a CUDA machine (H100/H200: < 4 min)
    python -m scripts.bench kernels --quick    # tiny CPU smoke test (TRITON_INTERPRET=1)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

# Goals (the issue): W8A8 GEMM vs bf16 and torch._int_mm at large M; end to end.
GOAL_VS_BF16 = 1.6
GOAL_VS_INT_MM = 0.9
GOAL_E2E_TIME = 0.7
GOAL_E2E_MEMORY = 0.55
LARGE_M = 4096
ESM_M = (512, 4096, 8192)  # batch x length: 1 x 512, 8 x 512, 16 x 512
PAIR_M = (4096, 8100)  # ESMFold pair rows L^2 for L = 64, 90
SEQ_M = (90, 1024)
IMPLS = ("bf16", "fp16", "int_mm", "w8a8", "w8a8+quant", "pwlq", "w4a8")


@dataclass(frozen=True)
class Case:
    """One GEMM: ``[m, k] x [n, k]^T``."""

    model: str
    layer: str
    m: int
    k: int
    n: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


def cases(quick: bool) -> list[Case]:
    """ESM-2 650M (1280 / 5120), ESM-2 3B (2560 / 10240), ESMFold trunk (seq 1024, pair 128)."""
    if quick:
        return [Case("tiny", "fc", 17, 48, 40)]
    out = []
    for model, d, f in (("ESM-2 650M", 1280, 5120), ("ESM-2 3B", 2560, 10240)):
        for layer, k, n in (("attn proj", d, d), ("fc1", d, f), ("fc2", f, d)):
            out += [Case(model, layer, m, k, n) for m in ESM_M]
    seq = (("seq attn proj", 1024, 1024, SEQ_M), ("seq transition", 1024, 4096, SEQ_M[1:]))
    pair = (("pair proj", 128, 128), ("pair transition in", 128, 512), ("pair transition out", 512, 128))
    out += [Case("ESMFold trunk", layer, m, k, n) for layer, k, n, ms in seq for m in ms]
    out += [Case("ESMFold trunk", layer, m, k, n) for layer, k, n in pair for m in PAIR_M]
    return out


def bench_ms(fn: Callable[[], object], cuda: bool) -> float:
    """Median milliseconds of ``fn``: do_bench on CUDA, a short wall-clock loop otherwise."""
    if cuda:
        import triton

        return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))
    fn()  # warm-up; the CPU path is a smoke test (interpreter), one timed call is enough
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _guard(fn: Callable[[], float]) -> float | str:
    try:
        return fn()
    except Exception as e:  # a failing cell must not stop the table
        return f"error: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"


def gemm_row(case: Case, device, cuda: bool) -> dict:
    """Time every implementation on one shape; values are ms (float) or an error string."""
    import torch
    import torch.nn.functional as F

    from ptq_protein.kernels import (
        fp8_gemm_supported,
        fp8_linear,
        int4_linear,
        int8_linear,
        pack_int4,
        pwlq_linear,
        quantize_per_token,
    )
    from ptq_protein.quant.fp8 import fp8_per_token, fp8_quantize, fp8_scale

    gen = torch.Generator(device=device).manual_seed(case.m + case.k + case.n)
    x = torch.randn(case.m, case.k, device=device, generator=gen).to(torch.bfloat16)
    w = (torch.randn(case.n, case.k, device=device, generator=gen) * 0.02).to(torch.bfloat16)
    b = torch.randn(case.n, device=device, generator=gen).to(torch.bfloat16)
    x_q, x_s, _ = quantize_per_token(x)
    w_q, w_s, _ = quantize_per_token(w)
    colsum = w_q.sum(1, dtype=torch.int32)
    packed = pack_int4(torch.clamp(torch.div(w_q, 16, rounding_mode="floor"), -8, 7))
    book = _pwlq_book()
    pw_codes = torch.randint(-127, 128, (case.m, case.k), device=device, dtype=torch.int8, generator=gen)
    w_qt = w_q.t()
    x16, w16, b16 = x.half(), w.half(), b.half()

    def w8a8_dynamic():
        q, s, _ = quantize_per_token(x)
        return int8_linear(q, s, None, w_q, w_s, b, colsum, out_dtype=torch.bfloat16)

    impls = {
        "bf16": lambda: F.linear(x, w, b),
        "fp16": lambda: F.linear(x16, w16, b16),
        "int_mm": lambda: torch._int_mm(x_q, w_qt),
        "w8a8": lambda: int8_linear(x_q, x_s, None, w_q, w_s, b, colsum, out_dtype=torch.bfloat16),
        "w8a8+quant": w8a8_dynamic,
        "pwlq": lambda: pwlq_linear(pw_codes, **book, w_q=w_q, w_scale=w_s, bias=b, out_dtype=torch.bfloat16,
                                    check_codes=False),
        "w4a8": lambda: int4_linear(x_q, x_s, None, packed, w_s, case.k, b, out_dtype=torch.bfloat16),
    }
    if fp8_gemm_supported(x.device):  # FP8 E4M3 (per-token x, per-channel w) in torch._scaled_mm, beside int8
        x8, x8_s = fp8_per_token(x.float(), "e4m3")
        w8_s = fp8_scale(w.float().abs().amax(1), "e4m3")
        w8 = fp8_quantize(w.float(), w8_s[:, None], "e4m3")
        impls["fp8"] = lambda: fp8_linear(x8, x8_s, w8, w8_s, b, out_dtype=torch.bfloat16)
    return {name: _guard(lambda fn=fn: bench_ms(fn, cuda)) for name, fn in impls.items()}


def _pwlq_book() -> dict:
    """Symmetric 8-bit PWLQ codebook (breakpoint 2, range 8, 64 centre levels): 3 integer GEMMs."""
    p, m, n = 2.0, 8.0, 64
    s_c, s_t = p / n, (m - p) / (127 - n)
    o = p - n * s_t
    return {"offsets": (-o, 0.0, o), "scales": (s_t, s_c, s_t), "code_lo": (-127, -n, n + 1),
            "code_hi": (-n - 1, n, 127)}


def e2e(device, cuda: bool, quick: bool) -> dict:
    """Forward time and peak memory of an ESM-2 3B-sized model, bf16 then W8A8 (converted in place)."""
    import torch
    from esm.model.esm2 import ESM2

    layers, dim, heads, batch, length = (1, 32, 2, 1, 8) if quick else (36, 2560, 40, 8, 512)
    torch.manual_seed(0)
    with torch.device(device):
        model = ESM2(num_layers=layers, embed_dim=dim, attention_heads=heads).to(torch.bfloat16).eval()
    tokens = torch.randint(4, 24, (batch, length), device=device)  # amino-acid tokens of the ESM-1b alphabet
    out = {"shape": f"{layers} layers, dim {dim}, {heads} heads; batch {batch} x length {length}"}
    out["bf16"] = _guard(lambda: _forward_stats(model, tokens, cuda))
    out["w8a8"] = _guard(lambda: _forward_stats(_to_w8a8(model), tokens, cuda))
    return out


def _to_w8a8(model):
    """Swap every nn.Linear inside the transformer layers for Int8Linear, in place (frees the bf16 weights)."""
    import torch

    from ptq_protein.kernels import Int8Linear

    for layer in model.layers:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(parent, name, Int8Linear.from_float(child))
    gc.collect()
    return model


def _forward_stats(model, tokens, cuda: bool) -> tuple[float, Optional[float]]:
    """(median forward ms, peak GiB allocated by one forward; None on CPU)."""
    import torch

    with torch.inference_mode():
        model(tokens)  # warm-up (autotuning, compilation)
        peak = None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            model(tokens)
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**30  # before do_bench allocates its L2-flush buffer
        ms = bench_ms(lambda: model(tokens)["logits"], cuda)
    return ms, peak


def _fmt(value, digits: int = 3) -> str:
    if isinstance(value, str):
        return value
    return "n/a" if value is None else f"{value:.{digits}g}"


def _tflops(case: Case, ms) -> str:
    return _fmt(case.flops / (ms * 1e-3) / 1e12) if isinstance(ms, float) else "-"


def _ratio(num, den) -> str:
    return f"{num / den:.2f}x" if isinstance(num, float) and isinstance(den, float) else "-"


def gemm_table(rows: list[tuple[Case, dict]]) -> str:
    head = ("| model | layer | M | K | N | bf16 ms | bf16 TFLOP/s | fp16 ms | _int_mm ms | _int_mm TOP/s | W8A8 ms | "
            "W8A8 TOP/s | W8A8 vs bf16 | W8A8 vs fp16 | W8A8 vs _int_mm | W8A8+quant ms | PWLQ ms | PWLQ TOP/s | "
            "W4A8 ms | W4A8 TOP/s | FP8 ms | FP8 vs W8A8 |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c, r in rows:
        cells = [c.model, c.layer, c.m, c.k, c.n, _fmt(r["bf16"]), _tflops(c, r["bf16"]), _fmt(r["fp16"]),
                 _fmt(r["int_mm"]), _tflops(c, r["int_mm"]), _fmt(r["w8a8"]), _tflops(c, r["w8a8"]),
                 _ratio(r["bf16"], r["w8a8"]), _ratio(r["fp16"], r["w8a8"]), _ratio(r["int_mm"], r["w8a8"]),
                 _fmt(r["w8a8+quant"]), _fmt(r["pwlq"]), _tflops(c, r["pwlq"]),
                 _fmt(r["w4a8"]), _tflops(c, r["w4a8"]), _fmt(r.get("fp8", "-")), _ratio(r["w8a8"], r.get("fp8"))]
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    return "\n".join(lines)


def e2e_table(res: dict) -> str:
    lines = [f"End to end ({res['shape']}):", "", "| model | forward ms | peak GiB |", "|---|---|---|"]
    for name in ("bf16", "w8a8"):
        val = res[name]
        ms, peak = val if isinstance(val, tuple) else (val, None)
        lines.append(f"| {name} | {_fmt(ms)} | {_fmt(peak)} |")
    return "\n".join(lines)


def goals_table(rows: list[tuple[Case, dict]], res: dict) -> str:
    def median_ratio(num_key, den_key):
        vals = [r[num_key] / r[den_key] for c, r in rows if c.m >= LARGE_M and
                isinstance(r[num_key], float) and isinstance(r[den_key], float)]
        return statistics.median(vals) if vals else None

    bf16, w8 = res.get("bf16"), res.get("w8a8")
    both = isinstance(bf16, tuple) and isinstance(w8, tuple)
    e2e_time = w8[0] / bf16[0] if both else None
    e2e_mem = w8[1] / bf16[1] if both and bf16[1] and w8[1] is not None else None
    checks = [
        (f"W8A8 GEMM throughput vs bf16 (median, M >= {LARGE_M})", median_ratio("bf16", "w8a8"), ">=", GOAL_VS_BF16),
        (f"W8A8 GEMM throughput vs torch._int_mm (median, M >= {LARGE_M})", median_ratio("int_mm", "w8a8"), ">=",
         GOAL_VS_INT_MM),
        ("e2e W8A8 forward time / bf16", e2e_time, "<=", GOAL_E2E_TIME),
        ("e2e W8A8 peak memory / bf16", e2e_mem, "<=", GOAL_E2E_MEMORY),
    ]
    lines = ["| goal | target | measured | met |", "|---|---|---|---|"]
    for name, value, op, target in checks:
        met = "-" if value is None else ("yes" if (value >= target if op == ">=" else value <= target) else "no")
        lines.append(f"| {name} | {op} {target} | {_fmt(value)} | {met} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes; on CPU under TRITON_INTERPRET=1")
    parser.add_argument("--skip-e2e", action="store_true", help="only the GEMM table")
    parser.add_argument("--json", metavar="PATH", help="also write the measurements as JSON")
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.quick:
        print("bench_kernels: no CUDA device found; run it on a GPU machine, or pass --quick for a CPU smoke test")
        return 2
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels (and triton) are imported
    device = torch.device("cuda" if cuda else "cpu")
    try:
        import triton
    except ImportError:
        print("bench_kernels: triton is not installed (pip install triton)")
        return 2

    where = torch.cuda.get_device_name(device) if cuda else f"CPU ({platform.processor() or 'unknown'}), interpreter"
    print(f"# bench_kernels on {where}: torch {torch.__version__}, triton {triton.__version__}"
          f"{' (--quick)' if args.quick else ''}\n")
    start = time.perf_counter()
    rows = []
    for case in cases(args.quick):
        try:
            rows.append((case, gemm_row(case, device, cuda)))
        except Exception as e:  # preparing the inputs failed (e.g. out of memory): the row says so
            rows.append((case, dict.fromkeys(IMPLS, f"error: {type(e).__name__}: {str(e)[:80]}")))
        if cuda:
            torch.cuda.empty_cache()
    print(gemm_table(rows), "\n")
    res = {"shape": "skipped", "bf16": "skipped", "w8a8": "skipped"}
    if not args.skip_e2e:
        try:
            res = e2e(device, cuda, args.quick)
        except Exception as e:  # e.g. fair-esm missing or out of memory while building the model
            res = {"shape": "failed", "bf16": f"error: {type(e).__name__}: {e}", "w8a8": "-"}
        print(e2e_table(res), "\n")
    print(goals_table(rows, res))
    print(f"\n(total {time.perf_counter() - start:.0f} s)")
    if args.json:
        gemm = [{**asdict(c), **r} for c, r in rows]
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": where, "gemm_ms": gemm, "e2e": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
