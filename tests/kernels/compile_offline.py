"""Compile every kernel launch for Hopper (sm_90a) and Ampere (sm_80) without a GPU.

Runs each public wrapper on CPU tensors of ESM-like shapes, captures the exact
kernel launch (arguments, constexprs, grid options) instead of running it, and
hands it to ``triton.compile`` with an explicit ``GPUTarget``: Triton lowers it
through TTIR/TTGIR/LLVM/PTX and the bundled ``ptxas`` to a cubin. That catches
what the CPU interpreter cannot: constructs the compiler rejects, shared
memory beyond the chip, register spills (from ``cuobjdump -res-usage``).

Usage (TRITON_INTERPRET must be unset)::

    python tests/kernels/compile_offline.py            # first config of each table
    python tests/kernels/compile_offline.py --all -v   # every config, with resource use

Exit code 0 when everything compiles within the shared-memory limits.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

# CUDA "maximum shared memory per block (opt-in)" in bytes: H100/H200, A100.
SHARED_LIMIT = {90: 232448, 80: 166912}
ARCH_OF_CC = {90: "hopper", 80: "ampere"}


@dataclass
class Launch:
    """One captured kernel launch."""

    name: str
    jit_fn: Any
    args: tuple
    kwargs: dict
    table: Any = None  # ConfigTable for autotuned kernels
    options: dict = field(default_factory=dict)


CAPTURED: list[Launch] = []


class _Capture:
    """Stands in for a kernel (or an autotuned kernel) and records its launch."""

    def __init__(self, name, jit_fn, table=None):
        self.name, self.jit_fn, self.table = name, jit_fn, table

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
            name = self.name + ("+int4" if kwargs.get("INT4_WEIGHTS") else "")
            CAPTURED.append(Launch(name, self.jit_fn, args, kwargs, self.table, options))

        return record


def capture_all() -> None:
    """Patch the kernel modules so their wrappers record launches, then call each wrapper."""
    import torch

    from ptq_protein.kernels import int4_gemm, int8_gemm, pwlq_encode, pwlq_gemm, quantize
    from ptq_protein.kernels.dispatch import Backend

    for mod in (int8_gemm, int4_gemm, pwlq_gemm, pwlq_encode, quantize):
        mod.resolve_backend = lambda backend, device: Backend.TRITON
        if hasattr(mod, "tuned_kernel"):
            mod.tuned_kernel = lambda kernel, table, key, device: _Capture(kernel.fn.__name__, kernel, table)
    for mod, name in ((quantize, "_quantize_per_token_kernel"), (quantize, "_quantize_per_tensor_kernel"),
                      (pwlq_encode, "_pwlq_quantize_kernel")):
        setattr(mod, name, _Capture(name, getattr(mod, name)))

    g = torch.Generator().manual_seed(0)
    m, k, n = 256, 1280, 512
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    x_q = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    w_q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    xs, ws = torch.rand(m), torch.rand(n)
    zero = torch.zeros(m, dtype=torch.int32)
    bias = torch.randn(n).to(torch.bfloat16)
    int8_gemm.int8_linear(x_q, xs, zero, w_q, ws, bias, out_dtype=torch.bfloat16)
    int8_gemm.int8_matmul_int32(x_q, w_q)
    packed = torch.zeros(n, k // 2, dtype=torch.uint8)
    int4_gemm.int4_linear(x_q, xs, None, packed, ws, k, bias, out_dtype=torch.float16)
    book = dict(offsets=[-1.0, 0.0, 1.0], scales=[0.05, 0.01, 0.05], code_lo=[-127, -64, 65], code_hi=[-65, 64, 127])
    pwlq_gemm.pwlq_linear(x_q, **book, w_q=w_q, w_scale=ws, bias=bias, out_dtype=torch.bfloat16)
    asym = dict(offsets=[-3.0, -1.0, 0.0, 0.5, 2.0], scales=[0.1, 0.02, 0.01, 0.03, 0.2],
                code_lo=[-128, -100, -20, 30, 90], code_hi=[-101, -21, 29, 89, 127])
    pwlq_gemm.pwlq_linear(x_q, **asym, w_q=w_q, w_scale=ws, out_dtype=torch.float32)
    uniform = dict(offsets=[0.0], scales=[0.02], code_lo=[-127], code_hi=[127])
    pwlq_gemm.pwlq_linear(x_q, **uniform, w_q=w_q, w_scale=ws, out_dtype=torch.bfloat16)
    pwlq_encode.pwlq_quantize(x, [-0.5, 0.5], **book)
    quantize.quantize_per_token(x, 8, True)
    quantize.quantize_per_token(x, 8, False)
    quantize.quantize_per_tensor(x, torch.tensor(0.1), torch.tensor(0, dtype=torch.int32))


def compile_launch(launch: Launch, cc: int, config_row=None):
    """``triton.compile`` one launch for compute capability ``cc``; returns the CompiledKernel."""
    import triton
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import native_specialize_impl

    fn = launch.jit_fn
    values = dict(zip(fn.arg_names, launch.args))
    values.update(launch.kwargs)
    options = dict(launch.options)
    if config_row is not None:
        values.update(dict(zip(launch.table.names, config_row[:-2])))
        options.update(num_warps=config_row[-2], num_stages=config_row[-1])
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        value = values[name]
        if fn.params[i].is_constexpr:
            signature[name], constexprs[name] = "constexpr", value
            continue
        ty, spec = native_specialize_impl(BaseBackend, value, False, True, True)
        signature[name] = ty
        if ty == "constexpr":
            constexprs[name] = spec
        elif spec == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)


def resource_usage(cubin: bytes) -> str:
    """Registers and local memory (spills) per thread, from the bundled ``cuobjdump -res-usage``."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        res = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, check=False)
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", res.stdout)
    if not found:
        return "regs=?"
    regs, stack, local = found.groups()
    return f"regs={regs} stack={stack} local={local}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every autotune config, not only the first")
    parser.add_argument("-v", "--verbose", action="store_true", help="print registers and spills per kernel")
    parser.add_argument("--cc", type=int, nargs="+", default=[90, 80], choices=sorted(SHARED_LIMIT))
    parser.add_argument("--kernels", nargs="+", default=None, help="only these kernel names (default: all)")
    parser.add_argument("--one-per-kernel", action="store_true", help="only the first launch of each kernel")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: offline compilation needs the real Triton compiler", file=sys.stderr)
        return 2
    capture_all()
    failures = 0
    launches = [x for x in CAPTURED if args.kernels is None or x.name in args.kernels]
    seen = set()
    for launch in launches:
        signature = (launch.name,
                     () if args.one_per_kernel else tuple(sorted((k, str(v)) for k, v in launch.kwargs.items())))
        if signature in seen:  # same kernel and constexprs: one compile is enough
            continue
        seen.add(signature)
        for cc in args.cc:
            rows = [None] if launch.table is None else list(launch.table.rows(ARCH_OF_CC[cc]))
            for row in rows if args.all else rows[:1]:
                label = f"{launch.name} sm_{cc} {row if row else launch.options}"
                try:
                    kernel = compile_launch(launch, cc, row)
                except Exception as e:  # report every failure, then fail once
                    failures += 1
                    print(f"FAIL {label}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                    continue
                shared = kernel.metadata.shared
                too_big = shared > SHARED_LIMIT[cc]
                failures += too_big
                extra = resource_usage(kernel.asm["cubin"]) if args.verbose else ""
                print(f"{'FAIL' if too_big else 'ok  '} {label} shared={shared} {extra}")
    print(f"{len(seen)} distinct launches, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
