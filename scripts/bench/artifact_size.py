#!/usr/bin/env python
"""Artifact size of W8 / W4 recipes against the fp32 safetensors of the same model (issue 3).

For each model it saves the float state dict with safetensors (tied tensors
stored once, as the artifact does), then for ``w8-only``, ``w8a8-pwlq``,
``w4-only`` and ``w4a8-pwlq`` runs ``pp.quantize`` + ``pp.save`` and reports the
size of ``model.safetensors`` and of the whole folder (with recipe.json and the
reports) over the fp32 file, split into weight codes, weight scales / zero
points, activation quantizer tensors and tensors kept in floating point. It then
``pp.load``s each artifact and checks that every output tensor (ESM-2: the
logits) is bit-identical to the in-memory quantized model's on a fixed batch.

Models: the seeded 12 x 480 fair-esm ESM-2 of ``quantize.py`` (large enough
that the embeddings, kept in fp32, do not dominate) and, for information, the
tiny ESMFold of :func:`ptq_protein.models.tiny.tiny_esmfold` (its fp32 trunk
pieces and heads are a large share of a tiny model).

    python -m scripts.bench artifact_size           # full run (~1 min)
    python -m scripts.bench artifact_size --quick   # tiny ESM-2 only (the smoke test)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import (  # noqa: E402  (sibling module: shared model, sequences, timing and table helpers)
    FULL_SHAPE,
    QUICK_SHAPE,
    build_esm2,
    command_line,
    environment_line,
    markdown_table,
    random_sequences,
)

# Goals of issue 3: artifact bytes / fp32 safetensors bytes.
GOALS = {"w8-only": 0.27, "w8a8-pwlq": 0.27, "w4-only": 0.15, "w4a8-pwlq": 0.15}
CALIBRATION_SEQS = 4
CHECK_BATCH = 2
TENSORS_FILE = "model.safetensors"  # ptq_protein.artifact.save_load.TENSORS


def fp32_safetensors_bytes(model: torch.nn.Module, folder: Path) -> int:
    """Bytes of the float state dict saved with safetensors, each tied tensor once."""
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for key, value in model.state_dict().items():
        ident = (value.data_ptr(), tuple(value.shape), value.dtype, value.stride())
        if value.numel() and ident in seen:
            continue
        seen.add(ident)
        tensors[key] = value.detach().to(torch.float32 if value.is_floating_point() else value.dtype).contiguous()
    path = folder / "fp32.safetensors"
    save_file(tensors, str(path))
    return path.stat().st_size


def tensor_breakdown(path: Path) -> Dict[str, int]:
    """Bytes of an artifact's tensors by role (payload only, without the safetensors header)."""
    from safetensors import safe_open

    out = {"codes": 0, "weight qparams": 0, "act qparams": 0, "float": 0}
    with safe_open(str(path), framework="pt") as handle:
        for key in handle.keys():
            tensor = handle.get_tensor(key)
            size = tensor.numel() * tensor.element_size()
            if key.endswith((".weight_codes", ".weight_packed")):
                out["codes"] += size
            elif key.endswith((".weight_scale", ".weight_zero_point")):
                out["weight qparams"] += size
            elif ".input_quant." in key:
                out["act qparams"] += size
            else:
                out["float"] += size
    return out


def _output_tensors(output) -> Dict[str, torch.Tensor]:
    items = output.items() if hasattr(output, "items") else enumerate(output)
    out = {}
    for key, value in items:
        if torch.is_tensor(value):
            out[str(key)] = value
        elif isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in _output_tensors(value).items()})
    return out


def identical_outputs(qmodel, loaded, batch) -> Tuple[bool, List[str]]:
    """Whether every output tensor of ``loaded`` equals ``qmodel``'s bit for bit; the names compared."""
    from ptq_protein.models.adapters import get_adapter

    adapter = get_adapter(qmodel)
    with torch.no_grad():
        want = _output_tensors(adapter.forward(qmodel.eval(), batch))
        got = _output_tensors(adapter.forward(loaded.eval(), batch))
    names = sorted(want)
    same = names == sorted(got) and all(torch.equal(want[n], got[n]) for n in names)
    return same, names


def bench_model(label: str, model, seqs: Sequence[str], presets: Sequence[str], workdir: Path) -> List[list]:
    """One table row per preset for ``model``."""
    import ptq_protein as pp
    from ptq_protein.models.adapters import get_adapter

    fp32 = fp32_safetensors_bytes(model, workdir)
    params = sum(p.numel() for p in model.parameters())
    batch = get_adapter(model).make_batch(list(seqs[:CHECK_BATCH]))
    rows = [[label, "fp32", f"{params / 1e6:.2f}M params", fp32 / 2**20, "1.000", "", "", "", ""]]
    for preset in presets:
        qmodel = pp.quantize(model, preset, calibration=list(seqs))
        folder = pp.save(qmodel, workdir / preset)
        tensor_bytes = (folder / TENSORS_FILE).stat().st_size
        folder_bytes = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        parts = tensor_breakdown(folder / TENSORS_FILE)
        same, names = identical_outputs(qmodel, pp.load(folder, backend="fake"), batch)  # as it was saved
        ratio, goal = tensor_bytes / fp32, GOALS[preset]
        met = "yes" if ratio <= goal else f"no (+{100 * (ratio / goal - 1):.0f}% over)"
        share = " / ".join(f"{100 * parts[k] / tensor_bytes:.0f}" for k in parts)
        rows.append([label, preset, share, tensor_bytes / 2**20, f"{ratio:.3f}", f"{folder_bytes / fp32:.3f}",
                     f"<= {goal}: {met}", "yes" if same else "NO",
                     ",".join(names) if len(names) <= 2 else f"{len(names)} tensors"])
    return rows


def _models(quick: bool) -> List[Tuple[str, Callable[[], torch.nn.Module], Sequence[str]]]:
    shape = QUICK_SHAPE if quick else FULL_SHAPE
    out = [(shape.describe().split(", length")[0], lambda: build_esm2(shape)[0],
            random_sequences(CALIBRATION_SEQS, shape.seq_len, seed=1))]
    if not quick:
        from ptq_protein.models.tiny import tiny_esmfold

        out.append(("tiny ESMFold (info)", lambda: tiny_esmfold(seed=0)[0],
                    random_sequences(CALIBRATION_SEQS, 24, seed=1)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny 2 x 64 ESM-2 only (smoke test)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"# Artifact size vs fp32 safetensors\n\n`{command_line(argv, __file__)}`\n\n"
          f"{environment_line(args.threads)}\n")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ptq-artifact-bench-") as tmp:
        for i, (label, build, seqs) in enumerate(_models(args.quick)):
            workdir = Path(tmp) / str(i)
            workdir.mkdir()
            rows += bench_model(label, build(), seqs, list(GOALS), workdir)
    header = ["model", "recipe", "% codes / w-qparams / a-qparams / float", "model.safetensors MiB",
              "tensors / fp32", "folder / fp32", "goal (tensors)", "load bit-identical", "outputs compared"]
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
