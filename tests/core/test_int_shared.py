"""Linears that read one input as one int8 GEMM (``nn/int_shared``: q, k and v of fair-esm attention).

References: the exact integer product (``int_matmul``, float64 epilogue) and the
same modules run one by one (no group).

What is exact on every CPU, and what is only close: the int32 accumulators are
exact wherever oneDNN runs (VNNI, AMX; without VNNI the split engine keeps them
exact), so they are compared bit for bit. The float32 epilogue (``x_scale *
w_scale[n] * (acc - zero * colsum[n]) + bias[n]``, per-token scales) runs inside
oneDNN's kernel, and which kernel, and so the order of its roundings, depends on
the GEMM's shape and the CPU: the group's one wide GEMM on an AMX Xeon gave other
last bits than each member's own. Each output is therefore held to the float64
epilogue of the exact accumulators within ``EPILOGUE_ROUNDINGS`` float32 roundings
(:func:`_epilogue_bound`), and the group to its members alone within twice that;
the same call repeated is the same kernel: bit for bit.
"""

import copy
import warnings

import pytest
import torch

import ptq_protein as pp
from ptq_protein.kernels.reference import int_matmul
from ptq_protein.models.adapters import get_adapter
from ptq_protein.models.tiny import tiny_esm2
from ptq_protein.nn import cpu_int8, int_fast
from ptq_protein.nn.int_fast import encode_codes
from ptq_protein.nn.modules import ActQuantizer, QuantLinear
from ptq_protein.recipes.config import Backend, Granularity, Scheme, TensorQuant

pytestmark = pytest.mark.skipif(not cpu_int8.available(), reason=cpu_int8.reason())

SEQS = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDEL", "ACDEFGHIKLMNPQRSTVWY", "GSH"]  # a padded batch


@pytest.fixture(params=["auto", "split"])
def engine_mode(request, monkeypatch):
    """This CPU's own mode, and the split engine forced (so a VNNI CPU tests the AVX2 path too); the module path
    (the whole-layer executor, ``nn.layer_int8``, off: it has tests of its own)."""
    from ptq_protein.nn import layer_int8

    monkeypatch.setattr(layer_int8, "blocker", lambda *args: "off in these tests")
    if request.param == "split":
        monkeypatch.setattr(cpu_int8, "mode", lambda: "split")
    return request.param


def _linear(k, n, gen, quant, bias=True):
    spec = TensorQuant(bits=8, granularity=Granularity.PER_CHANNEL, symmetric=True)
    codes = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    return QuantLinear(k, n, weight=None, weight_codes=codes,
                       weight_scale=torch.rand(n, generator=gen) + 0.01, weight_zero_point=torch.zeros(n),
                       weight_spec=spec, bias=torch.randn(n, generator=gen) if bias else None,
                       input_quant=copy.deepcopy(quant), backend=Backend.INT8)


def _group(k=67, outs=(17, 40, 9), seed=0, dynamic=False):
    """Three integer linears on one odd-shaped input, declared as a group, and their ungrouped twins."""
    gen = torch.Generator().manual_seed(seed)
    if dynamic:
        quant = ActQuantizer(TensorQuant(bits=8, granularity=Granularity.PER_TOKEN, dynamic=True))
    else:
        quant = ActQuantizer(TensorQuant(bits=8, scheme=Scheme.UNIFORM, symmetric=True), torch.tensor(0.02),
                             torch.tensor(0))
    members = tuple(_linear(k, n, gen, quant, bias=i != 1) for i, n in enumerate(outs))
    alone = copy.deepcopy(members)
    for m in members:
        m.shared_input = members
    return members, alone


# float32 roundings between an exact int32 accumulator and the output: the accumulator's conversion (exact below
# 2^24), the scale product, the zero-point term, the per-token scale, the bias add, and one to spare
EPILOGUE_ROUNDINGS = 6
EPS32 = 2.0 ** -24  # float32 unit roundoff


def _exact(member, x):
    """The member's output from exact integer accumulators and a float64 epilogue."""
    return _exact_parts(member, x)[0]


def _exact_parts(member, x):
    """(output, |output - bias| + |bias|) in float64: the exact value and the size its roundings scale with."""
    codes, params = encode_codes(member.input_quant, x.reshape(-1, x.shape[-1]))
    acc = int_matmul(codes, member.plain_weight_codes()).double()
    scale, zero = params[1].double().reshape(-1, 1), params[2].double().reshape(-1, 1)
    colsum = member.plain_weight_codes().double().sum(1)
    y = scale * (acc - zero * colsum) * member.weight_scale.double().reshape(1, -1)
    bias = torch.zeros(y.shape[-1], dtype=torch.float64) if member.bias is None else member.bias.double()
    return y + bias, y.abs() + bias.abs()


def _epilogue_bound(member, x):
    """Elementwise: how far a float32 epilogue of the exact accumulators may land from the float64 one."""
    return EPILOGUE_ROUNDINGS * EPS32 * _exact_parts(member, x)[1]


def _assert_epilogue_close(got, member, x, factor=1):
    exact, _ = _exact_parts(member, x)
    assert bool(((got.reshape(exact.shape).double() - exact).abs() <= factor * _epilogue_bound(member, x)).all())


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("m", [1, 35, 130])
def test_group_equals_each_member_alone(engine_mode, m, dynamic):
    """Odd shapes, codes over the whole range: every member's output is bit for bit its own GEMM's."""
    members, alone = _group(dynamic=dynamic)
    x = torch.randn(m, 1, 67) * 3
    with torch.no_grad():
        got = [mod(x) for mod in members]
        ref = [mod(x) for mod in alone]
    assert all(mod._int_cache.get("shared") is not None for mod in members)
    assert all("shared" not in mod._int_cache for mod in alone)
    for g, r, mod in zip(got, ref, members):
        assert g.shape == r.shape
        _assert_epilogue_close(g, mod, x)  # the group's GEMM
        _assert_epilogue_close(r, mod, x)  # the member's own
        assert mod.engine_ran == "onednn"


def test_group_accumulators_identical(engine_mode):
    """The stacked prepacked weight gives the exact integer accumulators of every member's codes."""
    members, _ = _group(k=129, outs=(7, 33, 40))
    x = torch.randn(130, 129) * 5
    with torch.no_grad():
        members[0](x)
    packed = members[0]._int_cache["shared"].packed
    codes = encode_codes(members[0].input_quant, x)[0]
    w = torch.cat([mod.plain_weight_codes() for mod in members])
    assert torch.equal(cpu_int8.accumulators(codes, packed), int_matmul(codes, w))


def test_one_encoding_and_one_gemm_per_input(monkeypatch):
    calls = []
    real = int_fast.encode_codes
    monkeypatch.setattr(int_fast, "encode_codes", lambda *a: calls.append(1) or real(*a))
    members, _ = _group()
    x = torch.randn(20, 67)
    with torch.no_grad():
        for mod in members:
            mod(x)
        assert len(calls) == 1
        members[1](x)  # a second call of a member: computed again, not a stale slice
        assert len(calls) == 2
        y = members[2](x)
        x.mul_(2)  # changed in place: the others' outputs are computed again
        assert len(calls) == 2
        y2 = members[2](x)
    assert len(calls) == 3 and not torch.equal(y, y2)


def test_members_that_do_not_share_codes_run_alone():
    members, alone = _group()
    members[1].input_quant.scale.fill_(0.03)  # another activation scale: other codes
    x = torch.randn(9, 67)
    with torch.no_grad():
        got = [mod(x) for mod in members]
        ref = [mod(x) for mod in alone[:1]]
        members[1].input_quant.scale.fill_(0.02)
        members[2].engine = pp.Engine.REFERENCE
        for mod in members:
            mod(x)
    assert all("shared" not in mod._int_cache for mod in members)
    assert torch.equal(got[0], ref[0])
    assert members[2].engine_ran == "reference"


def test_group_holds_one_int8_copy_and_saves_codes(tmp_path):
    members, alone = _group()
    x = torch.randn(11, 67)
    with torch.no_grad():
        outs = [mod(x) for mod in members]
    for mod, twin in zip(members, alone):
        assert "packed" not in mod._int_cache
        assert mod.weight_codes.untyped_storage().nbytes() <= 1  # plain copy released
        assert torch.equal(mod.plain_weight_codes(), twin.weight_codes)
        assert torch.equal(mod.state_dict()["weight_codes"], twin.weight_codes)
    copies = copy.deepcopy(members)
    with torch.no_grad():
        assert all(torch.equal(c(x), o) for c, o in zip(copies, outs))
    assert copies[0].shared_input[1] is copies[1]


def _model(preset):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tiny_esm2(seed=0)[0]
        return pp.quantize(model, preset, calibration=SEQS, backend="int8")


@pytest.mark.parametrize("preset", ["w8a8-uniform", "w8a8-dynamic", "w8a8-pwlq-int"])
def test_model_outputs_unchanged_by_the_group_on_padded_batch(engine_mode, preset):
    """Fused fair-esm attention groups q, k and v; logits equal the ungrouped model's (BOS/EOS rows in float)."""
    from ptq_protein.models import fused_float

    qmodel = pp.set_engine(_model(preset), "onednn")
    twin = copy.deepcopy(qmodel)
    tokens = get_adapter(qmodel).make_batch(SEQS).inputs["tokens"]
    with torch.no_grad():
        out = qmodel(tokens)["logits"]
        fused_float._share_input, real = (lambda projections: None), fused_float._share_input
        try:
            ref = twin(tokens)["logits"]
        finally:
            fused_float._share_input = real
    attn = qmodel.layers[0].self_attn
    assert attn.q_proj.shared_input == (attn.q_proj, attn.k_proj, attn.v_proj)
    assert "shared" in attn.v_proj._int_cache and "shared" not in twin.layers[0].self_attn.v_proj._int_cache
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_explicit_attention_ungroups():
    from ptq_protein.models.fused_float import use_fused_float_

    qmodel = _model("w8a8-uniform")
    tokens = get_adapter(qmodel).make_batch(SEQS).inputs["tokens"]
    with torch.no_grad():
        qmodel(tokens)
    use_fused_float_(qmodel, enabled=False)
    assert all(getattr(m, "shared_input", None) is None for m in qmodel.modules() if isinstance(m, QuantLinear))


def test_inference_mode_compares_the_input_object():
    """Inference tensors keep no version counter: the group still serves each member once per input object."""
    members, alone = _group()
    x = torch.randn(13, 67)
    calls = []
    real = int_fast.encode_codes
    with torch.inference_mode():
        int_fast.encode_codes = lambda *a: calls.append(1) or real(*a)
        try:
            got = [mod(x) for mod in members]
            assert len(calls) == 1  # one encoding, one GEMM for the three members
            again = [mod(x.clone()) for mod in members]  # another object each time: computed again
            assert len(calls) == 1 + len(members)
        finally:
            int_fast.encode_codes = real
        ref = [mod(x) for mod in alone]
    for g, a, r, mod in zip(got, again, ref, members):
        assert torch.equal(g, a)  # the same GEMM on the same codes: the same kernel, bit for bit
        _assert_epilogue_close(g, mod, x)
        _assert_epilogue_close(r, mod, x)
        assert bool(((g.double() - r.double()).abs() <= 2 * _epilogue_bound(mod, x)).all())
