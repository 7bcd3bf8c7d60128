"""Inputs that were silently ignored or misread are now honoured or refused in one line."""


import numpy as np
import pytest

import ptq_protein as pp
from ptq_protein.support.errors import InputError


@pytest.mark.parametrize("value", [-5, 0, 2.5, True])
def test_bad_calib_max_length_is_refused(esm2, seqs, value):
    """calib_max_length=-5 used to crop every sequence to nothing and leave every site FP."""
    with pytest.raises(InputError, match="calib_max_length"):
        pp.quantize(esm2, "w8a8-uniform", calibration=seqs, calib_max_length=value)


def test_num_recycles_on_esm2_and_unknown_backend_are_refused(esm2, seqs):
    with pytest.raises(InputError, match="only applies to ESMFold"):
        pp.quantize(esm2, "w8a8-uniform", calibration=seqs, num_recycles=2)
    with pytest.raises(InputError, match="fake"):
        pp.quantize(esm2, "w8-only", backend="int9")


def test_compare_models_refuses_a_bare_string_and_unknown_residues(esm2):
    q = pp.quantize(esm2, "w8-only")
    with pytest.raises(TypeError, match="one string"):
        pp.compare_models(esm2, q, "MKTAYIAK")
    with pytest.raises(ValueError, match="J"):
        pp.compare_models(esm2, q, ["MKTJAYIAK"])
    assert set(pp.compare_models(esm2, q, ["MKTAYIAK"])) >= {"relative_error", "top1_agreement"}


def _native_text():
    from ptq_protein.data.sets import load_set

    bench = load_set("cameo139:1")
    return bench.native_text(bench.targets[0])


def test_a_repeated_residue_number_is_refused_not_dropped():
    from ptq_protein.eval.structure import load_structure

    lines = [ln for ln in _native_text().splitlines() if ln.startswith("ATOM")]
    numbers = sorted({int(ln[22:26]) for ln in lines})
    renumbered = [ln[:22] + f"{numbers[0]:4d}" + ln[26:] if int(ln[22:26]) == numbers[1] else ln for ln in lines]
    assert len(load_structure("\n".join(lines) + "\nEND\n").sequence) == len(numbers)
    with pytest.raises(InputError, match=f"residue {numbers[0]} .* appears twice"):
        load_structure("\n".join(renumbered) + "\nEND\n")
    first = [ln for ln in lines if int(ln[22:26]) == numbers[0]]
    with pytest.raises(InputError, match="appears twice"):  # the same residue written twice in a row
        load_structure("\n".join(first + first) + "\nEND\n")


def test_contact_precision_of_a_range_without_native_contacts_is_undefined(tmp_path, capsys):
    from ptq_protein.cli.main import main
    from ptq_protein.eval.structure import Structure

    t = np.linspace(0, 3, 12)  # a short straight-ish chain: no long-range pair at all
    ca = np.stack([3.8 * 3 * t, np.zeros_like(t), np.zeros_like(t)], -1)
    s = Structure.from_arrays(ca, n=ca + [0.5, 1.2, 0.3], c=ca + [1.0, -0.8, 0.6])
    from ptq_protein.eval.contacts import contact_precision

    metrics = contact_precision(np.random.default_rng(0).random((12, 12)), s)
    assert np.isnan(metrics["long_P@L"])
    garbage = tmp_path / "g.npy"
    garbage.write_bytes(b"not an array at all")
    native = tmp_path / "n.pdb"
    native.write_text(_native_text())
    assert main(["contacts", str(garbage), str(native)]) == 2
    err = capsys.readouterr().err
    assert "g.npy" in err and "allow_pickle" not in err and len(err.strip().splitlines()) == 1


def test_nan_weights_name_the_site(esm2):
    import copy

    import torch

    broken = copy.deepcopy(esm2)
    name, linear = next((n, m) for n, m in broken.named_modules() if isinstance(m, torch.nn.Linear) and "layers" in n)
    with torch.no_grad():
        linear.weight[0, 0] = float("nan")
    with pytest.raises(InputError, match=f"site {name}"):
        pp.quantize(broken, "w8-only")


def test_library_warnings_reach_the_cli_as_one_logging_line(capsys):
    import logging
    import warnings

    from ptq_protein.cli.main import _route_library_noise

    saved = warnings.showwarning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            _route_library_noise()
            records = []
            handler = logging.Handler()
            handler.emit = records.append
            logging.getLogger("py.warnings").addHandler(handler)
            try:
                warnings.warn("pairs[0] has only 2 common residues;\n its TM-score is degenerate", stacklevel=1)
            finally:
                logging.getLogger("py.warnings").removeHandler(handler)
    finally:
        warnings.showwarning = saved
    assert len(records) == 1 and "\n" not in records[0].getMessage() and "degenerate" in records[0].getMessage()
