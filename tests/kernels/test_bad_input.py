"""Bad input raises one clear ValueError naming the argument (never a silent fallback)."""

import pytest
import torch

from ptq_protein.kernels import dispatch
from ptq_protein.kernels.int4_gemm import int4_linear
from ptq_protein.kernels.int8_gemm import int8_linear, int8_matmul_int32
from ptq_protein.kernels.packing import pack_int4, unpack_int4
from ptq_protein.kernels.pwlq_codebook import check_codebook, check_thresholds
from ptq_protein.kernels.pwlq_encode import pwlq_quantize
from ptq_protein.kernels.pwlq_gemm import pwlq_linear
from ptq_protein.kernels.quantize import quantize_per_tensor, quantize_per_token

M, K, N = 4, 16, 6
X_Q = torch.zeros(M, K, dtype=torch.int8)
W_Q = torch.zeros(N, K, dtype=torch.int8)
XS, WS = torch.ones(M), torch.ones(N)
BOOK = {"offsets": [0.0], "scales": [0.1], "code_lo": [-127], "code_hi": [127]}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"x_q": X_Q.float()}, "x_q must have dtype torch.int8"),
        ({"w_q": W_Q.to(torch.int32)}, "w_q must have dtype torch.int8"),
        ({"w_q": torch.zeros(N, K + 1, dtype=torch.int8)}, "x_q has K=16 columns but w_q has K=17"),
        ({"x_q": torch.zeros(2, M, K, dtype=torch.int8)}, "x_q must be 2-D"),
        ({"x_scale": XS.half()}, "x_scale must have dtype torch.float32"),
        ({"x_scale": torch.ones(M + 1)}, r"x_scale must be a scalar tensor \(per-tensor\) or have shape \(4,\)"),
        ({"x_zero": torch.zeros(M, dtype=torch.int64)}, "x_zero must have dtype torch.int32"),
        ({"w_scale": torch.ones(N + 1)}, r"w_scale must have shape \(6,\)"),
        ({"bias": torch.ones(N, dtype=torch.int32)}, "bias must be float16, bfloat16 or float32"),
        ({"w_colsum": torch.zeros(N), "x_zero": torch.zeros(M, dtype=torch.int32)}, "w_colsum must have dtype"),
        ({"out_dtype": torch.int32}, "out_dtype=torch.int32"),
        ({"backend": "cuda"}, "backend='cuda' is not one of"),
        ({"bias": torch.ones(N, device="meta")}, "all tensors must be on one device"),
    ],
)
def test_int8_linear_rejects(kwargs, match):
    args = {"x_q": X_Q, "x_scale": XS, "x_zero": None, "w_q": W_Q, "w_scale": WS}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        int8_linear(**args)


def test_matmul_and_k_limits():
    with pytest.raises(ValueError, match="b_q must have dtype torch.int8"):
        int8_matmul_int32(X_Q, W_Q.to(torch.uint8))
    with pytest.raises(ValueError, match=r"K=0 must be in \[1, 65536\]"):
        int8_matmul_int32(torch.zeros(2, 0, dtype=torch.int8), torch.zeros(3, 0, dtype=torch.int8))


def test_triton_backend_refused_where_it_cannot_run(monkeypatch):
    monkeypatch.setattr(dispatch, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="backend='triton' cannot run: the tensors are on cpu"):
        int8_linear(X_Q, XS, None, W_Q, WS, backend="triton")
    # "auto" falls back to the exact reference and says nothing
    assert int8_linear(X_Q, XS, None, W_Q, WS).shape == (M, N)


def test_int4_rejections():
    with pytest.raises(ValueError, match=r"w_q values must lie in \[-8, 7\]"):
        pack_int4(torch.full((2, 4), 8, dtype=torch.int8))
    packed = pack_int4(torch.zeros(N, K, dtype=torch.int8))
    with pytest.raises(ValueError, match="packed has 8 bytes per row but K=20 needs 10"):
        unpack_int4(packed, 20)
    with pytest.raises(ValueError, match="w_packed must have dtype torch.uint8"):
        int4_linear(X_Q, XS, None, packed.view(torch.int8), WS, K)
    with pytest.raises(ValueError, match="x_q has K=16 columns but the K argument has K=15"):
        int4_linear(X_Q, XS, None, packed, WS, 15)


def test_quantize_rejections():
    with pytest.raises(ValueError, match="x must be float16, bfloat16 or float32"):
        quantize_per_token(torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"bits=9 must be an int in \[2, 8\]"):
        quantize_per_token(torch.zeros(2, 3), bits=9)
    with pytest.raises(ValueError, match="K=0 columns"):
        quantize_per_token(torch.zeros(2, 0))
    with pytest.raises(ValueError, match="scale must have dtype torch.float32"):
        quantize_per_tensor(torch.zeros(2, 3), torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"zero must be a scalar tensor"):
        quantize_per_tensor(torch.zeros(2, 3), torch.tensor(1.0), torch.zeros(3, dtype=torch.int32))


def test_codebook_rejections():
    with pytest.raises(ValueError, match="same length R"):
        check_codebook([0.0, 1.0], [0.1], [-127], [127])
    with pytest.raises(ValueError, match="scales must be positive"):
        check_codebook([0.0], [0.0], [-127], [127])
    with pytest.raises(ValueError, match="contiguous and ascending"):
        check_codebook([0.0, 0.0], [0.1, 0.2], [-127, 2], [0, 127])
    with pytest.raises(ValueError, match="code_hi"):
        check_codebook([0.0], [0.1], [-127], [200])
    with pytest.raises(ValueError, match="must hold integers"):
        check_codebook([0.0], [0.1], [-127.5], [127])
    with pytest.raises(ValueError, match="thresholds must be ascending"):
        check_thresholds([1.0, 0.0], 3)
    with pytest.raises(ValueError, match="R-1 = 2 values"):
        pwlq_quantize(torch.zeros(2, 3), [0.0], [0.0] * 3, [0.1] * 3, [-127, -10, 11], [-11, 10, 127])


def test_pwlq_codes_outside_the_codebook():
    narrow = {"offsets": [0.0], "scales": [0.1], "code_lo": [-7], "code_hi": [7]}
    x_codes = torch.full((M, K), 9, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"x_codes hold codes in \[9, 9\] but the codebook covers \[-7, 7\]"):
        pwlq_linear(x_codes, **narrow, w_q=W_Q, w_scale=WS)
    assert pwlq_linear(x_codes, **narrow, w_q=W_Q, w_scale=WS, check_codes=False).shape == (M, N)
    with pytest.raises(ValueError, match="x_codes must have dtype torch.int8"):
        pwlq_linear(x_codes.float(), **BOOK, w_q=W_Q, w_scale=WS)


def test_int32_indexing_limit():
    huge = torch.zeros(1, 1, dtype=torch.int8).expand(2**16, 2**16)  # 2^32 elements, no memory
    with pytest.raises(ValueError, match="the kernels index with int32"):
        int8_matmul_int32(huge, W_Q)
