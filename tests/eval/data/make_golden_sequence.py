"""Golden values for ``tm_score(..., normalize="sequence")``: the TMscore program called as ``TMscore native model``.

The program normalises by its second argument, so swapping the arguments of
``make_golden.py``'s calls normalises by the model (for a prediction, its full
sequence), as the ESMFold-quantization study called it (``TMscore native pred``).
Two parts, both written to ``golden_tmscore_sequence.json``:

* ``swapped``: every case of ``golden_tmscore.json`` scored again with the
  arguments swapped (eigenfold cases against the same renumbered native copy).
* ``missing``: predictions of the full sequence of the bundled cameo2022 targets
  with the most unobserved native residues, exact on the observed residues
  (``exact_*``) or with noise (``noise_*``), scored both ways.

Not part of the test suite (needs the program and /work/shared/data); see README.md.
"""

from __future__ import annotations

import csv
import json
import tempfile
from pathlib import Path

import numpy as np
from make_golden import (
    SEED,
    THREE,
    first_banner_line,
    parse_args,
    read_ca,
    renumbered_native,
    run_tmscore,
    sequence_alignment,
    write_pdb,
)

MISSING_TARGETS = ("7vf3.B", "7q83.D", "8ds5.A")  # cameo2022: 15/155, 156/274, 96/164 residues observed
ONE = {v: k for k, v in THREE.items()}


def main() -> None:
    args = parse_args(__doc__)
    out, shared = Path(args.out), Path(args.shared)
    golden = json.loads((Path(__file__).parent / "golden_tmscore.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        ctx = {"tmscore": args.tmscore, "out": out, "tmp": Path(tmp), "rng": np.random.default_rng(SEED)}
        cases = [swapped_case(ctx, c, shared) for c in golden["cases"]]
        cases += missing_cases(ctx, shared)
    program = dict(golden["program"], version_line=first_banner_line(args.tmscore))
    result = {"program": program, "seed": SEED, "called_as": "TMscore native model", "cases": cases}
    (out / "golden_tmscore_sequence.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(cases)} cases written to {out}")


def swapped_case(ctx: dict, case: dict, shared: Path) -> dict:
    structures = ctx["out"] / "structures"
    native = structures / case["native"]
    if case["pairing"] == "sequence":  # TMscore pairs by number: score against the renumbered copy
        target = case["native"][: -len(".native.pdb.gz")]
        model = read_ca(_gunzip(structures / case["model"]))
        native = ctx["tmp"] / f"{target}.renumbered.pdb.gz"
        write_pdb(native,
                  renumbered_native(model, read_ca((shared / "cameo2022" / "native" / f"{target}.pdb").read_text())))
    return {"id": case["id"], "part": "swapped", "model": case["model"], "native": case["native"],
            "pairing": case["pairing"], "tmscore_sequence": run_tmscore(ctx, native, structures / case["model"])}


def missing_cases(ctx: dict, shared: Path) -> list:
    seqres = {row["name"][: -len(".pdb")]: row["seqres"]
              for row in csv.DictReader(open(shared / "cameo2022" / "targets.csv"))}
    out = []
    for target in MISSING_TARGETS:
        native = read_ca((shared / "cameo2022" / "native" / f"{target}.pdb").read_text())
        native_file = f"{target}.native.pdb.gz"
        write_pdb(ctx["out"] / "structures" / native_file, native)
        exact = full_sequence_model(seqres[target], native)
        noisy = [(n, k, i, xyz + ctx["rng"].normal(0, 1.5, size=3)) for n, k, i, xyz in exact]
        scored = ctx["tmp"] / f"{target}.renumbered.pdb.gz"
        write_pdb(scored, renumbered_native(exact, native))
        for kind, model in (("exact", exact), ("noise", noisy)):
            case_id = f"{kind}_{target}"
            model_file = f"{case_id}.model.pdb.gz"
            write_pdb(ctx["out"] / "structures" / model_file, model)
            path = ctx["out"] / "structures" / model_file
            out.append({"id": case_id, "part": "missing", "model": model_file, "native": native_file,
                        "pairing": "sequence",
                        "note": f"full-sequence prediction of {target}, "
                                + ("exact on the observed residues" if kind == "exact" else "N(0, 1.5 A) noise"),
                        "tmscore_native": run_tmscore(ctx, path, scored),
                        "tmscore_sequence": run_tmscore(ctx, scored, path)})
    return out


def full_sequence_model(seqres: str, native: list) -> list:
    """CA trace of the whole sequence numbered 1..L: native CAs where observed, linear interpolation between them."""
    index = sequence_alignment(seqres, "".join(THREE.get(r[0], "X") for r in native))
    known = {index[i]: r[3] for i, r in enumerate(native) if i in index}
    positions = sorted(known)
    xyz = np.stack([np.interp(np.arange(len(seqres)), positions, [known[p][d] for p in positions]) for d in range(3)],
                   1)
    return [(ONE.get(a, "GLY"), k + 1, "", xyz[k]) for k, a in enumerate(seqres)]


def _gunzip(path: Path) -> str:
    import gzip

    return gzip.decompress(path.read_bytes()).decode()


if __name__ == "__main__":
    main()
