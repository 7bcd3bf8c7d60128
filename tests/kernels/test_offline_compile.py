"""The GEMM kernels (W8A8, W4A8, PWLQ) compile for Hopper (sm_90a) through ptxas without a GPU.

The interpreter accepts code the compiler rejects; this runs the real Triton
compiler on the exact launches the wrappers make (tests/kernels/compile_offline.py,
which also has the full sweep: ``--all -v`` for every config on sm_90 and sm_80).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = Path(__file__).with_name("compile_offline.py")


@pytest.mark.slow
def test_gemm_kernels_compile_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    cmd = [sys.executable, str(SCRIPT), "--cc", "90", "--one-per-kernel",
           "--kernels", "_int8_gemm_kernel", "_int8_gemm_kernel+int4", "_pwlq_gemm_kernel"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 distinct launches, 0 failures" in res.stdout
