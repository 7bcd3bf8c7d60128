"""Golden digests of every preset's artifact on the tiny models (``tests/core/data/golden_digests.json``).

A digest pins what ``pp.quantize`` produces, so a refactor of the driver can
show it changed nothing. What is hashed:

* presets that save (ours, the baselines): the folder ``pp.save`` writes. The
  tensors of ``model.safetensors`` (name, dtype, shape, bytes, in name order),
  ``report.json`` as written, and ``recipe.json`` without ``versions`` (the
  installed library versions) and ``files`` (the tensor file's checksum, which
  covers its header, which seals ``versions``). Nothing else varies between runs.
* ``study-*`` presets (not saved by design): the quantized model's state dict
  (same hashing) and its ``ptq_state`` (config, sites, swaps, calibration, report, FP sites).
* a preset the model refuses: the error's type and message.

Besides the presets on each model, a few runs cover ``quantize``'s other paths
(``backend="int8"``, ``inplace=True``, a shared ``statistics=`` pass, the study's
observers riding our pass on ESMFold).

Float reductions differ between CPU kernels (AVX2 vs AVX-512) and torch
versions, so the JSON keeps one record per ``<cpu capability>/torch <version>``;
the test skips a key with no record. Run at one thread, as the test does::

    OMP_NUM_THREADS=1 python scripts/make_golden_digests.py            # add/replace this machine's key
    OMP_NUM_THREADS=1 python scripts/make_golden_digests.py --check    # compare, print what differs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterator, Tuple

import torch

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "core" / "data" / "golden_digests.json"
CALIBRATION = ["MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "MENDELKKLLAAGHRW"]  # the tests' first two
CROP = 24  # residues: keeps ESMFold's cubic trunk cheap


def machine_key() -> str:
    """The record this machine's digests belong to."""
    return f"{torch.backends.cpu.get_cpu_capability()}/torch {torch.__version__}"


def _models() -> Dict[str, Callable[[], torch.nn.Module]]:
    from ptq_protein.models.tiny import tiny_esm2, tiny_esmfold, tiny_hf_esm2

    return {
        "tiny-esm2": lambda: tiny_esm2(seed=0)[0],  # fair-esm, demo outlier channels planted
        "tiny-esm2-plain": lambda: tiny_esm2(seed=1, outliers=None)[0],  # fair-esm, no outliers
        "tiny-esm2-hf": lambda: tiny_hf_esm2(seed=0)[0],  # transformers, same weights as tiny-esm2
        "tiny-esmfold": lambda: tiny_esmfold(seed=0)[0],  # transformers ESMFold, outliers in its stem
    }


def _hash_tensors(digest, tensors: Dict[str, torch.Tensor]) -> None:
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu().reshape(-1)
        digest.update(f"{name}|{t.dtype}|{tuple(tensors[name].shape)}|".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def artifact_digest(qmodel: torch.nn.Module) -> str:
    """sha256 of what ``pp.save`` writes (study recipes: of the model and its ``ptq_state``)."""
    from safetensors.torch import load_file

    import ptq_protein as pp

    digest = hashlib.sha256()
    state = qmodel.ptq_state
    if state.config.study is not None:
        _hash_tensors(digest, qmodel.state_dict())
        record = {"config": state.config.to_dict(), "family": state.family, "sites": [s.to_dict() for s in state.sites],
                  "quantized": state.quantized, "fp_sites": state.fp_sites, "report": state.report,
                  "calibration": None if state.calibration is None else state.calibration.to_dict()}
        digest.update(json.dumps(record, sort_keys=True, default=str).encode())
        return digest.hexdigest()
    with tempfile.TemporaryDirectory() as tmp:
        out = pp.save(qmodel, Path(tmp) / "artifact")
        _hash_tensors(digest, load_file(str(out / "model.safetensors")))
        digest.update((out / "report.json").read_bytes())
        recipe = json.loads((out / "recipe.json").read_text())
        recipe.pop("versions"), recipe.pop("files")
        # transformers stamps its own version into the saved model config: a version, not the artifact's content
        (recipe.get("architecture") or {}).get("config", {}).pop("transformers_version", None)
        digest.update(json.dumps(recipe, sort_keys=True).encode())
    return digest.hexdigest()


def _run(make: Callable[[], torch.nn.Module]) -> str:
    try:
        return artifact_digest(make())
    except (ValueError, TypeError) as e:  # InputError is a ValueError
        return f"refused: {type(e).__name__}: {e}"


def cases() -> Iterator[Tuple[str, Callable[[], str]]]:
    """(case name, thunk returning its digest), in a fixed order."""
    import ptq_protein as pp
    from ptq_protein.recipes.presets import PRESETS

    kw = dict(calibration=CALIBRATION, calib_max_length=CROP)
    for label, build in _models().items():
        model = build()
        for preset in PRESETS:
            yield f"{label}/{preset}", lambda m=model, p=preset: _run(lambda: pp.quantize(m, p, **kw))
    esm2 = _models()["tiny-esm2"]()
    yield "tiny-esm2/w8a8-uniform+int8", lambda: _run(lambda: pp.quantize(esm2, "w8a8-uniform", backend="int8", **kw))
    yield "tiny-esm2/w8a8-pwlq+inplace", lambda: _run(lambda: pp.quantize(_models()["tiny-esm2"](), "w8a8-pwlq",
                                                                          inplace=True, **kw))
    for label, shared in (("tiny-esm2", ["w8a8-pwlq", "w8a8-uniform", "a8-pwlq", "study-a8-pwlq", "study-w8a8-pwlq"]),
                          ("tiny-esmfold", ["w8a8-uniform", "study-a8-pwlq", "study-w8a8-pwlq"])):
        model = _models()[label]()  # ESMFold (batch 1): the study's observers ride our pass
        for name in shared:
            yield f"{label}/{name}+shared", lambda m=model, n=name, r=shared: _run(lambda: _shared(m, n, r, kw))


def _shared(model, name: str, recipes, kw) -> torch.nn.Module:
    import ptq_protein as pp
    from ptq_protein.workflows.shared_calibration import calibrate_recipes

    key = (id(model), tuple(recipes))
    if key not in _PASSES:
        _PASSES[key] = calibrate_recipes(model, recipes, kw["calibration"], calib_max_length=kw["calib_max_length"])[0]
    return pp.quantize(model, name, statistics=_PASSES[key][name])


_PASSES: Dict[tuple, dict] = {}


def compute() -> Dict[str, str]:
    torch.set_num_threads(1)
    return {name: thunk() for name, thunk in cases()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored record instead of writing")
    args = parser.parse_args(argv)
    stored = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    got = compute()
    if args.check:
        want = stored.get(machine_key(), {})
        bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        print("\n".join(f"differs: {k}" for k in bad) or f"all {len(got)} digests equal")
        return 1 if bad else 0
    stored[machine_key()] = got
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(got)} digests for {machine_key()} to {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
