"""The CPU fast path of backend="int8" (oneDNN) against the exact torch reference (the oracle)."""

import copy

import pytest
import torch

import ptq_protein as pp
from ptq_protein.kernels.reference import int_matmul, pwlq_linear_reference
from ptq_protein.models.adapters import get_adapter
from ptq_protein.nn import cpu_int8, cpu_pwlq
from ptq_protein.nn.int_exec import engine_used, set_engine
from ptq_protein.nn.int_fast import encode_codes
from ptq_protein.nn.modules import QuantLinear
from ptq_protein.quant.codebook import PiecewiseCodebook, pwlq_quantize

pytestmark = pytest.mark.skipif(not cpu_int8.available(), reason=cpu_int8.reason())

SHAPES = [(1, 5, 3), (7, 24, 17), (33, 67, 40), (130, 129, 9)]  # (M, K, N): odd on purpose
PRESETS = ["w8a8-uniform", "w8a8-dynamic", "w8a8-pwlq", "w4a8-pwlq"]


def _rel(a, b):
    """Largest elementwise error over the largest reference magnitude (float64)."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _codes(m, k, gen, lo=-128, hi=127):
    return torch.randint(lo, hi + 1, (m, k), dtype=torch.int8, generator=gen)


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_accumulators_identical(m, k, n):
    gen = torch.Generator().manual_seed(m * k + n)
    a, w = _codes(m, k, gen), _codes(n, k, gen, -127)
    acc = cpu_int8.accumulators(a, cpu_int8.prepack(w, torch.ones(n)))
    assert acc.dtype == torch.int32 and torch.equal(acc, int_matmul(a, w))


def _native_saturates() -> bool:
    """oneDNN's single call on the extreme pair 127 x 127 against float64 (AVX2 without VNNI: int16 pair sums)."""
    a, w = torch.full((2, 64), 127, dtype=torch.int8), torch.full((4, 64), 127, dtype=torch.int8)
    packed = cpu_int8.prepack(w, torch.ones(4))
    u = torch.full((2, 64), 255, dtype=torch.uint8)  # code 127 as the u8 operand 255 with zero point 128
    y = torch.ops.onednn.qlinear_pointwise(u, 1.0, 128, packed.weight, packed.w_scale, packed.w_zero, None, 1.0, 0,
                                           torch.float32, "none", [], "")
    return not torch.equal(y.double(), a.double() @ w.double().t())


def test_probe_names_the_engine_and_why():
    assert cpu_int8.mode() == ("split" if _native_saturates() else "native")
    assert ("saturates at int16" in cpu_int8.reason()) == (cpu_int8.mode() == "split")


def test_u8_operand_is_the_same_code_for_every_code_and_zero():
    codes = torch.arange(-128, 128, dtype=torch.int8)
    for zero in (-128, -3, 0, 5, 127):
        u, z = cpu_int8.as_u8(codes, zero)
        assert u.dtype == torch.uint8 and torch.equal(u.long() - z, codes.long() - zero)


def test_native_gemm_hands_onednn_u8_operands(monkeypatch):
    """oneDNN's fast kernels are built for u8 activations against PyTorch's prepacked weights; s8 ones fall to its
    reference kernel on some AVX-512 VNNI CPUs (seconds per GEMM): no native call may pass int8 codes."""
    if cpu_int8.mode() != "native":
        pytest.skip("this CPU runs the split engine (its operands are int8 by design)")
    seen, op = [], torch.ops.onednn.qlinear_pointwise
    monkeypatch.setattr(torch.ops.onednn, "qlinear_pointwise", lambda a, *rest: seen.append(a.dtype) or op(a, *rest))
    gen = torch.Generator().manual_seed(3)
    a, w = _codes(9, 40, gen), _codes(7, 40, gen, -127)
    packed = cpu_int8.prepack(w, torch.ones(7))
    y = cpu_int8.static_linear(a, packed, 1.0, -5, None)
    assert seen == [torch.uint8] and torch.equal(y.double(), (a.double() + 5) @ w.double().t())


@pytest.fixture(params=["auto", "split"])
def engine_mode(request, monkeypatch):
    """This CPU's own mode, and the split engine forced (so a VNNI CPU tests the AVX2 path too)."""
    if request.param == "split":
        monkeypatch.setattr(cpu_int8, "mode", lambda: "split")
    return request.param


EXTREMES = {"top": (127, 127), "bottom": (-128, -127), "mixed": (127, -127), "random": None}


@pytest.mark.parametrize("m,k,n", SHAPES + [(4, 1920, 11)])
@pytest.mark.parametrize("codes", list(EXTREMES))
def test_split_accumulators_identical_on_extreme_codes(engine_mode, m, k, n, codes):
    """The saturating pairs of AVX2 (255 x 127 twice) give the exact integers, on odd shapes."""
    gen = torch.Generator().manual_seed(m + k)
    if EXTREMES[codes] is None:
        a, w = _codes(m, k, gen), _codes(n, k, gen, -127)
    else:
        a, w = torch.full((m, k), EXTREMES[codes][0], dtype=torch.int8), torch.full((n, k), EXTREMES[codes][1],
                                                                                        dtype=torch.int8)
    packed = cpu_int8.prepack(w, torch.ones(n))
    assert torch.equal(cpu_int8.accumulators(a, packed), int_matmul(a, w))
    y = cpu_int8.static_linear(a, cpu_int8.prepack(w, torch.full((n,), 0.5)), 0.25, 3, None)
    assert torch.equal(y.double(), 0.125 * ((a.double() - 3) @ w.double().t()))  # exact: powers of two, < 2^24


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("zero", [0, 17, -128])
def test_static_epilogue_matches_reference(engine_mode, m, k, n, zero):
    gen = torch.Generator().manual_seed(k)
    a, w = _codes(m, k, gen), _codes(n, k, gen, -127)
    w_scale, bias = torch.rand(n, generator=gen) + 0.01, torch.randn(n, generator=gen)
    y = cpu_int8.static_linear(a, cpu_int8.prepack(w, w_scale), 0.037, zero, bias)
    exact = 0.037 * w_scale.double() * ((a.double() - zero) @ w.double().t()) + bias.double()
    assert _rel(y, exact) <= 1e-6


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_per_token_epilogue_matches_reference(engine_mode, m, k, n):
    gen = torch.Generator().manual_seed(n)
    a, w = _codes(m, k, gen), _codes(n, k, gen, -127)
    scale, zero = torch.rand(m, generator=gen) + 1e-3, torch.randint(-128, 128, (m,), generator=gen)
    w_scale, bias = torch.rand(n, generator=gen) + 0.01, torch.randn(n, generator=gen)
    y = cpu_int8.per_token_linear(a, scale, zero, cpu_int8.prepack(w, w_scale), bias)
    exact = scale.double()[:, None] * w_scale.double() * ((a.double() - zero.double()[:, None]) @ w.double().t())
    assert _rel(y, exact + bias.double()) <= 1e-6


def _books():
    sym = PiecewiseCodebook(8, (-127, -63, 64), (-64, 63, 127), (-0.5, 0.0, 0.5), (0.02, 0.004, 0.02), (-0.25, 0.25))
    asym = PiecewiseCodebook(8, (-128, -117, -93, 77), (-118, -94, 76, 127), (0.275, 0.51, 1.055, -0.5),
                             (0.0035, 0.0055, 0.0113, 0.0318), (-0.13, -0.0027, 1.93))
    # the presets' shape with zero code 8 and exactly representable parameters: the two centre lines meet
    # at code 8 exactly, so the second centre piece is one operand (q - 8)
    hinge = PiecewiseCodebook(8, (-128, -96, 9, 104), (-97, 8, 103, 127), (0.5, -0.125, -0.25, -10.0),
                              (1 / 16, 1 / 64, 1 / 32, 1 / 8), (-3.6, 0.015625, 2.984375))
    # as the presets store them: the same knot at code 8, missed by the float32 rounding of the offsets
    rounded = PiecewiseCodebook(8, (-128, -96, 9, 104), (-97, 8, 103, 127),
                                (0.5, -0.0439318, float(torch.tensor(-0.0439318 - 0.0041 * 8)), -10.0),
                                (1 / 16, 0.0220, 0.0220 + 0.0041, 1 / 8), (-3.6, 0.015625, 2.984375))
    return [sym, asym, hinge, rounded]


def _pwlq_inputs(m, k, gen, tails):
    """Values mostly in the centre; tail values nowhere, in two columns, in 1% of entries, or everywhere."""
    x = (torch.randn(m, k, generator=gen) * 0.1).clamp(-0.2, 0.2)
    if tails == "columns":
        spread = torch.zeros(m, k, dtype=torch.bool)
        spread[:, [0, k // 2]] = torch.rand(m, 2, generator=gen) < 0.5
    else:
        spread = torch.rand(m, k, generator=gen) < {"none": 0.0, "rare": 0.01, "everywhere": 1.0}[tails]
    return torch.where(spread, torch.randn(m, k, generator=gen) * 6, x)


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("book", range(4))
@pytest.mark.parametrize("tails", ["none", "columns", "rare", "everywhere"])
def test_pwlq_matches_reference(engine_mode, m, k, n, book, tails):
    cb = _books()[book]
    gen = torch.Generator().manual_seed(m + k + n)
    codes = pwlq_quantize(_pwlq_inputs(m, k, gen, tails), cb).to(torch.int8)
    w, w_scale, bias = _codes(n, k, gen, -127), torch.rand(n, generator=gen) + 0.01, torch.randn(n, generator=gen)
    packed = cpu_int8.prepack(w, w_scale)
    plan = cpu_pwlq.pwlq_plan(cb, packed, bias)
    # knots: asym's left tail line meets the base line at code -100 (0.275 - 0.0035 * 100 == 1.055 - 0.0113 * 100
    # up to the rounding of the decimal literals); the hinge books at code 8
    assert [r.hinge for r in plan.regions] == [[None] * 2, [-100, None, None], [None, 8, None], [None, 8, None]][book]
    ops = cpu_pwlq.pwlq_operands(codes, plan)
    for _, _, operand in ops.dense:  # every int8 correction GEMM's accumulators are the exact integers
        assert torch.equal(cpu_int8.accumulators(operand, packed), int_matmul(operand, w))
    if tails == "columns" and k >= 32:  # the tails ran as one float64 GEMM over exactly those columns
        assert ops.cols.tolist() == [0, k // 2] and ops.tails.dtype == torch.float64
    y = cpu_pwlq.pwlq_linear(codes, plan, packed)
    exact = pwlq_linear_reference(codes, cb.offset, cb.scale, cb.code_lo, cb.code_hi, w, w_scale, bias, torch.float64)
    assert _rel(y, exact) <= 1e-6


def test_pwlq_empty_batch():
    cb = _books()[1]
    packed = cpu_int8.prepack(_codes(9, 24, torch.Generator().manual_seed(1), -127), torch.ones(9))
    y = cpu_pwlq.pwlq_linear(torch.zeros(0, 24, dtype=torch.int8), cpu_pwlq.pwlq_plan(cb, packed, None), packed)
    assert y.shape == (0, 9)


def test_gemm_add_accumulates_in_place(engine_mode):
    gen = torch.Generator().manual_seed(5)
    a, w = _codes(33, 67, gen), _codes(40, 67, gen, -127)
    w_scale, out = torch.rand(40, generator=gen) + 0.01, torch.randn(33, 40, generator=gen)
    start = out.double()
    got = cpu_int8.gemm_add_(out, a, cpu_int8.prepack(w, w_scale), -0.3)
    assert got.data_ptr() == out.data_ptr()
    assert _rel(got, start - 0.3 * w_scale.double() * (a.double() @ w.double().t())) <= 1e-6


def _site_inputs(model, tokens):
    """Each integer site's input during one forward of ``model`` (reference engine)."""
    inputs, handles = {}, []
    for name, mod in model.named_modules():
        if isinstance(mod, QuantLinear) and mod.input_quant is not None:
            handles.append(mod.register_forward_pre_hook(lambda m, a, name=name: inputs.setdefault(name, a[0])))
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for h in handles:
            h.remove()
    return inputs


@pytest.fixture(scope="module")
def padded_tokens():
    from ptq_protein.models.tiny import tiny_esm2

    model = tiny_esm2(seed=0)[0]
    seqs = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDEL", "ACDEFGHIKLMNPQRSTVWY", "GSH"]  # padded batch
    return model, seqs, get_adapter(model).make_batch(seqs).inputs["tokens"]


@pytest.mark.parametrize("preset", PRESETS)
def test_sites_equal_reference_on_padded_batch(engine_mode, padded_tokens, preset):
    model, seqs, tokens = padded_tokens
    qmodel = set_engine(pp.quantize(model, preset, calibration=seqs, backend="int8"), "reference")
    inputs = _site_inputs(qmodel, tokens)
    assert engine_used(qmodel) == "reference"
    for name, x in inputs.items():
        site = qmodel.get_submodule(name)
        codes_ref = site.input_quant.encode(x.reshape(-1, x.shape[-1]))[0]
        assert torch.equal(encode_codes(site.input_quant, x.reshape(-1, x.shape[-1]))[0], codes_ref.to(torch.int8))
        with torch.no_grad():
            site.engine = pp.Engine.REFERENCE
            ref = site(x)
            site.engine = pp.Engine.ONEDNN  # auto may take the float path (PWLQ where oneDNN is split)
            fast = site(x)
        assert site.engine_ran == "onednn" and _rel(fast, ref) <= 1e-6, name


@pytest.mark.parametrize("preset", ["w8a8-uniform", "w8a8-dynamic"])
def test_site_accumulators_identical_on_padded_batch(engine_mode, padded_tokens, preset):
    """Every site's int32 accumulators on a padded batch's real codes equal the exact integer product."""
    from ptq_protein.nn.int_fast import prepack_module

    model, seqs, tokens = padded_tokens
    qmodel = pp.quantize(model, preset, calibration=seqs, backend="int8")
    for name, x in _site_inputs(qmodel, tokens).items():
        site = qmodel.get_submodule(name)
        codes = encode_codes(site.input_quant, x.reshape(-1, x.shape[-1]))[0]
        w = site.plain_weight_codes().to(torch.int8)
        assert torch.equal(cpu_int8.accumulators(codes, prepack_module(site)), int_matmul(codes, w)), name


def test_fast_module_holds_one_int8_copy_and_saves_codes(padded_tokens, tmp_path):
    model, seqs, tokens = padded_tokens
    qmodel = set_engine(pp.quantize(model, "w8a8-pwlq", calibration=seqs, backend="int8"), "onednn")
    codes = {n: m.weight_codes.clone() for n, m in qmodel.named_modules() if isinstance(m, QuantLinear)}
    with torch.no_grad():
        out = qmodel(tokens)["logits"]
    for name, mod in qmodel.named_modules():
        if name in codes and mod.input_quant is not None:
            assert mod.weight_codes.untyped_storage().nbytes() <= 1  # plain copy released after prepacking
            assert torch.equal(mod.plain_weight_codes(), codes[name])
            assert torch.equal(qmodel.state_dict()[f"{name}.weight_codes"], codes[name])
    with torch.no_grad():
        assert torch.equal(copy.deepcopy(qmodel)(tokens)["logits"], out)
    pp.save(qmodel, tmp_path / "art")
    loaded = set_engine(pp.load(tmp_path / "art"), "onednn")
    with torch.no_grad():
        assert torch.equal(loaded(tokens)["logits"], out)
    assert engine_used(loaded) == "onednn"


def test_bad_engine_refused(padded_tokens):
    model, seqs, _ = padded_tokens
    qmodel = pp.quantize(model, "w8a8-uniform", calibration=seqs, backend="int8")
    with pytest.raises(ValueError, match="unknown engine 'fast'.*auto, onednn, reference"):
        set_engine(qmodel, "fast")


def test_fold_json_names_the_engine(tmp_path, capsys):
    from ptq_protein.cli.main import main

    art = tmp_path / "art"
    assert main(["quantize", "tiny-esmfold", "--preset", "w8a8-uniform", "--calib", "casp14:2", "--num-recycles", "0",
                 "--backend", "int8", "--check", "0", "--out", str(art)]) == 0  # its TM is outside the 8-bit bound
    fasta = tmp_path / "t.fasta"
    fasta.write_text(">one\nMKTAYIAKQRQISFVK\n")
    capsys.readouterr()
    assert main(["fold", str(art), "--fasta", str(fasta), "--out", str(tmp_path / "p"), "--num-recycles", "0",
                 "--json"]) == 0
    engine = __import__("json").loads(capsys.readouterr().out)["engine"]
    assert engine.split("+")[0] == "onednn"
    loaded = pp.load(art, engine="reference")
    assert all(m.engine is pp.Engine.REFERENCE for m in loaded.modules() if isinstance(m, QuantLinear))


@pytest.mark.parametrize("preset", ["w8a8-uniform", "w8a8-pwlq"])
def test_fake_and_int8_sites_agree_on_padded_batch(padded_tokens, preset):
    """Issue 12 item 7: given the same input, every site's fake and int8 outputs agree to float rounding.

    End to end they can part: the fake GEMM rounds in float32 (decoded activations
    and a BLAS sum), the integer path is exact, and a value within an ulp of a
    rounding tie of the *next* quantizer then gets the neighbouring code, which
    later layers amplify. Both are checked here on a padded batch.
    """
    from ptq_protein.recipes.config import Backend

    model, seqs, tokens = padded_tokens
    real = set_engine(pp.quantize(model, preset, calibration=seqs, backend="int8"), "onednn")
    inputs = _site_inputs(real, tokens)
    for name, x in inputs.items():
        site = real.get_submodule(name)
        with torch.no_grad():
            y_int = site(x)
            site.backend = Backend.FAKE
            y_fake = site(x)
            site.backend = Backend.INT8
        assert _rel(y_int, y_fake) <= 1e-5, name


def _int8_forward_warnings(qmodel, tokens):
    from ptq_protein.nn import int_exec

    int_exec._warn_float.cache_clear()  # one line per cause and process: start this test's process afresh
    with pytest.warns(int_exec.EngineFallbackWarning) as caught, torch.no_grad():
        out = qmodel(tokens)["logits"]
        qmodel(tokens)  # a second forward adds no line
    return out, [str(w.message) for w in caught if issubclass(w.category, int_exec.EngineFallbackWarning)]


def test_site_without_onednn_kernel_runs_float_and_says_why(padded_tokens):
    """Dynamic PWLQ inputs: no oneDNN kernel, so the fake backend's product, one warning line."""
    from ptq_protein.recipes.config import Backend

    model, seqs, tokens = padded_tokens
    qmodel = pp.quantize(model, "w8a8-pwlq-dynamic", backend="int8")
    out, lines = _int8_forward_warnings(qmodel, tokens)
    assert len(lines) == 1 and "runs the float path" in lines[0] and "static PWLQ inputs only" in lines[0]
    assert "\n" not in lines[0] and engine_used(qmodel) == "float"
    for m in qmodel.modules():
        if isinstance(m, QuantLinear):
            m.backend = Backend.FAKE
    with torch.no_grad():
        fake = qmodel(tokens)["logits"]
    assert _rel(out, fake) <= 1e-5  # the fake product (BOS/EOS rows read from the codes: float rounding apart)


def test_cpu_without_exact_int8_runs_float_and_says_why(padded_tokens, monkeypatch):
    """No exact oneDNN GEMM (no oneDNN, or saturation the split cannot undo): float path, the probe's reason."""
    model, seqs, tokens = padded_tokens
    qmodel = pp.quantize(model, "w8a8-uniform", calibration=seqs, backend="int8")
    monkeypatch.setattr(cpu_int8, "_probe", lambda: (None, "oneDNN's int8 GEMM is not exact on this CPU, even split"))
    _, lines = _int8_forward_warnings(qmodel, tokens)
    assert len(lines) == 1 and "not exact on this CPU, even split" in lines[0] and engine_used(qmodel) == "float"
    with pytest.raises(ValueError, match="engine 'onednn' is not available here .*not exact on this CPU"):
        set_engine(qmodel, "onednn")
    set_engine(qmodel, "reference")
    with torch.no_grad():
        qmodel(tokens)
    assert engine_used(qmodel) == "reference"  # asked for: the exact reference still runs


def test_split_cpu_runs_pwlq_as_float_and_uniform_on_onednn(padded_tokens, monkeypatch):
    """Where oneDNN must split every GEMM, PWLQ's exact engine is slower than fake: float path and one line;
    uniform sites stay on the exact oneDNN engine, with no warning."""
    import warnings

    model, seqs, tokens = padded_tokens
    monkeypatch.setattr(cpu_int8, "mode", lambda: "split")
    pwlq = pp.quantize(model, "w8a8-pwlq", calibration=seqs, backend="int8")
    _, lines = _int8_forward_warnings(pwlq, tokens)
    assert len(lines) == 1 and "PWLQ's exact int8 GEMMs" in lines[0] and engine_used(pwlq) == "float"
    uniform = pp.quantize(model, "w8a8-uniform", calibration=seqs, backend="int8")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")
        uniform(tokens)
    assert engine_used(uniform) == "onednn"
