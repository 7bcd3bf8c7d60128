"""Every preset's artifact on the tiny models, byte for byte, against digests made before a refactor.

The digests (``tests/core/data/golden_digests.json``) were made by
``scripts/make_golden_digests.py`` (see its docstring for what is hashed) on
the code as it stood before ``pp.quantize`` became a driver of passes; a change
that is meant to leave every artifact as it was must keep this test green.

Float reductions differ between CPU kernels and torch versions, so the record
is keyed by ``<torch.backends.cpu.get_cpu_capability()>/torch <version>``. A
machine with no record skips; make one there, from the code before the change, with::

    OMP_NUM_THREADS=1 python scripts/make_golden_digests.py
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("esm")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_golden_digests.py"


def _script():
    spec = importlib.util.spec_from_file_location("make_golden_digests", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_preset_artifact_matches_its_golden_digest():
    import torch

    golden = _script()
    record = json.loads(golden.GOLDEN.read_text()).get(golden.machine_key())
    if record is None:
        pytest.skip(f"no golden digests for {golden.machine_key()}: run "
                    "'OMP_NUM_THREADS=1 python scripts/make_golden_digests.py' on the code before the change")
    threads = torch.get_num_threads()
    try:
        got = golden.compute()  # pins one thread: digests must not depend on the thread count
    finally:
        torch.set_num_threads(threads)
    from ptq_protein.recipes.presets import PRESETS

    assert {k.split("/")[1] for k in got if "+" not in k} == set(PRESETS), "a preset has no case"
    gone = sorted(set(record) - set(got))
    assert not gone, f"recorded cases no longer made: {gone}; regenerate the goldens on the code before the change"
    # a case added since the record (a new preset) is checked where its digest was recorded: records of other machines
    # cannot be remade here, and the recorded cases still pin every artifact that existed
    differs = [name for name in record if got[name] != record[name]]
    assert not differs, f"{len(differs)} artifact(s) changed: {differs}"
