"""Regenerate the TM-score golden values in this folder from the TMscore program.

Not part of the test suite (it needs the program and /work/shared/data); see
README.md here for the exact command. Deterministic: fixed seeds, gzip with
mtime 0. Parsing and file writing here are plain column slicing, independent
of ``ptq_protein.eval``, so the goldens do not inherit its reading rules.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SEED = 20240607
NOISE_NATIVES = ("7PNO", "7TV9", "7VNA", "7YWG", "7PB4", "7ERN", "7TZG", "7W5U")  # cameo139, 24..513 residues
NOISE_LEVELS = (0.3, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)  # Å, Gaussian per coordinate
HINGE = (("7YWG", (30, 60, 90, 150)), ("7ERN", (20, 45, 90, 160)))  # degrees
SHIFT = (("7VNA", (1, 2, 5)), ("7TZG", (1, 3, 8)))
UNRELATED = (("7TV9", "7VNA"), ("7VNA", "7YWG"), ("7YWG", "7PB4"), ("7PB4", "7ERN"), ("7ERN", "7TZG"), ("7W5U", "7TZG"))
SHORT = (12, 18, 21, 30)  # first residues of 7TV9


def parse_args(description: str) -> argparse.Namespace:
    """--tmscore, --shared, --out (shared with make_golden_sequence.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tmscore", default="/tmp/TMscore", help="TMscore executable")
    parser.add_argument("--shared", default="/work/shared/data", help="the project's shared data folder")
    parser.add_argument("--out", default=str(Path(__file__).parent), help="output folder")
    return parser.parse_args()


def main() -> None:
    args = parse_args(__doc__)
    out, shared = Path(args.out), Path(args.shared)
    (out / "structures").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        ctx = {"tmscore": args.tmscore, "out": out, "tmp": Path(tmp), "rng": rng}
        natives = {name: read_ca((shared / "cameo139" / "native" / f"{name}.pdb").read_text())
                   for name in NOISE_NATIVES}
        for name, res in natives.items():
            write_pdb(out / "structures" / f"{name}.native.pdb.gz", res)
        cases += noise_cases(ctx, natives)
        cases += hinge_cases(ctx, natives)
        cases += shift_cases(ctx, natives)
        cases += unrelated_cases(ctx, natives)
        cases += missing_cases(ctx, natives)
        cases += short_cases(ctx, natives)
        cases += eigenfold_cases(ctx, shared)
    program = Path(args.tmscore).read_bytes()
    golden = {"program": {"name": "TMscore (Fortran TMscore.f, Zhang & Skolnick 2004)",
                          "version_line": first_banner_line(args.tmscore),
                          "sha256": hashlib.sha256(program).hexdigest(),
                          "source": "pengshuang/PTQ4Protein structure_prediction/scripts/TMscore"},
              "seed": SEED, "cases": cases}
    (out / "golden_tmscore.json").write_text(json.dumps(golden, indent=1) + "\n")
    print(f"{len(cases)} cases written to {out}")


# --- PDB text, by columns (PDB format v3.3) -------------------------------------------------

def read_ca(text: str) -> list:
    """CA records of the first model's first chain: (resname, number, icode, xyz); altloc ' ' or 'A'."""
    residues, chain = [], None
    for line in text.splitlines():
        if line.startswith(("ENDMDL", "TER")) and residues:
            break
        if not line.startswith("ATOM") or line[12:16] != " CA " or line[16] not in " A":
            continue
        if chain is None:
            chain = line[21]
        if line[21] != chain:
            break
        xyz = np.array([float(line[30:38]), float(line[38:46]), float(line[46:54])])
        residues.append((line[17:20], int(line[22:26]), line[26].strip(), xyz))
    return residues


def write_pdb(path: Path, residues: list) -> None:
    lines = [f"ATOM  {i + 1:>5}  CA  {name:>3} A{num:>4}{icode or ' ':1}   {x:8.3f}{y:8.3f}{z:8.3f}  1.00  "
             "0.00           C"
             for i, (name, num, icode, (x, y, z)) in enumerate(residues)]
    data = ("\n".join(lines + ["TER", "END"]) + "\n").encode()
    with open(path, "wb") as handle, gzip.GzipFile(fileobj=handle, mode="wb", mtime=0, filename="") as gz:
        gz.write(data)


def with_coords(residues: list, xyz: np.ndarray) -> list:
    return [(name, num, icode, xyz[i]) for i, (name, num, icode, _) in enumerate(residues)]


def coords(residues: list) -> np.ndarray:
    return np.stack([r[3] for r in residues])


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def rigid(rng: np.random.Generator, xyz: np.ndarray) -> np.ndarray:
    return xyz @ random_rotation(rng).T + rng.normal(0, 20, size=3)


def axis_rotation(axis: np.ndarray, degrees: float) -> np.ndarray:
    axis = axis / np.linalg.norm(axis)
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    a = math.radians(degrees)
    return np.eye(3) + math.sin(a) * k + (1 - math.cos(a)) * k @ k


# --- TMscore --------------------------------------------------------------------------------

def run_tmscore(ctx: dict, model: Path, native: Path) -> dict:
    """Scores printed by ``TMscore model native`` (inputs gunzipped to plain files first)."""
    plain = []
    for path in (model, native):
        target = ctx["tmp"] / path.name.replace(".gz", "")
        target.write_bytes(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
        plain.append(str(target))
    text = subprocess.run([ctx["tmscore"], *plain], capture_output=True, text=True, check=True).stdout
    grab = lambda pattern: re.search(pattern, text).group(1)  # noqa: E731
    return {"tm_score": float(grab(r"TM-score\s*=\s*([\d.]+)")),
            "rmsd": float(grab(r"RMSD of  the common residues=\s*([\d.]+)")),
            "gdt_ts": float(grab(r"GDT-TS-score=\s*([\d.]+)")),
            "gdt_ha": float(grab(r"GDT-HA-score=\s*([\d.]+)")),
            "maxsub": float(grab(r"MaxSub-score=\s*([\d.]+)")),
            "n_aligned": int(grab(r"Number of residues in common=\s*(\d+)")),
            "length": int(grab(r"Structure2:.*Length=\s*(\d+)"))}


def first_banner_line(program: str) -> str:
    """The program prints no version; its banner's reference and contact lines identify the release."""
    with tempfile.TemporaryDirectory() as tmp:
        pdb = Path(tmp) / "x.pdb"
        pdb.write_text("".join(f"ATOM  {i + 1:>5}  CA  GLY A{i + 1:>4}    {3.8 * i:8.3f}{0:8.3f}{0:8.3f}  1.00  0.00\n"
                               for i in range(5)))
        text = subprocess.run([program, str(pdb), str(pdb)], capture_output=True, text=True).stdout
    lines = [line.strip(" *") for line in text.splitlines() if "Reference" in line or "email" in line]
    return "; ".join(lines)


def case(ctx: dict, case_id: str, category: str, model_res: list, native_file: str, note: str,
         scored_native: Path = None, pairing: str = "number") -> dict:
    model_file = f"{case_id}.model.pdb.gz"
    write_pdb(ctx["out"] / "structures" / model_file, model_res)
    native_path = scored_native or ctx["out"] / "structures" / native_file
    scores = run_tmscore(ctx, ctx["out"] / "structures" / model_file, native_path)
    return {"id": case_id, "category": category, "model": model_file, "native": native_file,
            "pairing": pairing, "note": note, "tmscore": scores}


# --- cases ----------------------------------------------------------------------------------

def noise_cases(ctx: dict, natives: dict) -> list:
    out = []
    for k, (name, res) in enumerate(natives.items()):
        for j in range(4):
            sigma = NOISE_LEVELS[(k + 2 * j) % len(NOISE_LEVELS)]
            xyz = rigid(ctx["rng"], coords(res) + ctx["rng"].normal(0, sigma, size=(len(res), 3)))
            out.append(case(ctx, f"noise_{name}_{sigma:g}", "noise", with_coords(res, xyz), f"{name}.native.pdb.gz",
                            f"native + N(0, {sigma:g} A) per coordinate, then a random rigid motion"))
    return out


def hinge_cases(ctx: dict, natives: dict) -> list:
    out = []
    for name, angles in HINGE:
        res = natives[name]
        xyz = coords(res)
        hinge = len(res) // 2
        axis = ctx["rng"].normal(size=3)
        for angle in angles:
            moved = xyz.copy()
            moved[hinge:] = (xyz[hinge:] - xyz[hinge]) @ axis_rotation(axis, angle).T + xyz[hinge]
            out.append(case(ctx, f"hinge_{name}_{angle}", "hinge", with_coords(res, rigid(ctx["rng"], moved)),
                            f"{name}.native.pdb.gz",
                            f"residues {hinge + 1}.. rotated {angle} deg about CA {hinge + 1}"))
    return out


def shift_cases(ctx: dict, natives: dict) -> list:
    out = []
    for name, shifts in SHIFT:
        res = natives[name]
        for shift in shifts:
            model = [(rname, num + shift, icode, xyz) for rname, num, icode, xyz in res]
            out.append(case(ctx, f"shift_{name}_{shift}", "register_shift", model, f"{name}.native.pdb.gz",
                            f"native coordinates renumbered +{shift} (pairing by number pairs i with i-{shift})"))
    return out


def unrelated_cases(ctx: dict, natives: dict) -> list:
    out = []
    for model_name, native_name in UNRELATED:
        res = natives[model_name]
        out.append(case(ctx, f"unrelated_{model_name}_{native_name}", "unrelated",
                        with_coords(res, rigid(ctx["rng"], coords(res))), f"{native_name}.native.pdb.gz",
                        f"native {model_name} scored against native {native_name}, paired by number"))
    return out


def missing_cases(ctx: dict, natives: dict) -> list:
    rng, out = ctx["rng"], []
    plans = (("7PB4", np.r_[0:39, 79:215], 1.0, "residues 40-79 missing"),
             ("7TZG", np.arange(60, 373), 2.0, "first 60 residues missing"),
             ("7VNA", np.sort(rng.choice(114, size=91, replace=False)), 1.5, "23 random residues missing"),
             ("7ERN", np.r_[0:90, 190:284], 0.5, "residues 91-190 missing"))
    for name, keep, sigma, note in plans:
        res = [natives[name][i] for i in keep]
        xyz = rigid(rng, coords(res) + rng.normal(0, sigma, size=(len(res), 3)))
        out.append(case(ctx, f"missing_{name}", "missing", with_coords(res, xyz), f"{name}.native.pdb.gz",
                        f"{note}, N(0, {sigma:g} A) noise"))
    return out


def short_cases(ctx: dict, natives: dict) -> list:
    out = []
    for length in SHORT:
        res = natives["7TV9"][:length]
        native_file = f"7TV9_{length}.native.pdb.gz"
        write_pdb(ctx["out"] / "structures" / native_file, res)
        xyz = rigid(ctx["rng"], coords(res) + ctx["rng"].normal(0, 1.0, size=(length, 3)))
        out.append(case(ctx, f"short_7TV9_{length}", "short", with_coords(res, xyz), native_file,
                        f"first {length} residues of 7TV9 (d0 near its 0.5 A floor), N(0, 1 A) noise"))
    return out


def eigenfold_cases(ctx: dict, shared: Path) -> list:
    """EigenFold predictions (numbered along seqres) vs natives (author numbering), paired by sequence.

    TMscore pairs by number only, so it scores the model against a copy of the
    native renumbered through a Biopython global alignment (BLOSUM62, gaps
    11/1, free end gaps); unaligned native residues get numbers no model
    residue has. The stored native keeps its author numbering.
    """
    out = []
    for sample in sorted((shared / "cameo2022" / "eigenfold_samples").glob("*.pdb.0.pdb")):
        target = sample.name[: -len(".pdb.0.pdb")]
        model = read_ca(sample.read_text())
        native = read_ca((shared / "cameo2022" / "native" / f"{target}.pdb").read_text())
        native_file = f"{target}.native.pdb.gz"
        write_pdb(ctx["out"] / "structures" / native_file, native)
        scored = ctx["tmp"] / f"{target}.renumbered.pdb.gz"
        write_pdb(scored, renumbered_native(model, native))
        out.append(case(ctx, f"eigenfold_{target}", "eigenfold", model, native_file,
                        "EigenFold sample 0 vs native, paired by sequence alignment", scored_native=scored,
                        pairing="sequence"))
    return out


THREE = {"ALA": "A", "ARG": "R", "ASN": "N", "ASP": "D", "CYS": "C", "GLN": "Q", "GLU": "E", "GLY": "G",
         "HIS": "H", "ILE": "I", "LEU": "L", "LYS": "K", "MET": "M", "PHE": "F", "PRO": "P", "SER": "S",
         "THR": "T", "TRP": "W", "TYR": "Y", "VAL": "V"}


def sequence_alignment(seq_a: str, seq_b: str) -> dict:
    """{index in b: index in a} of a Biopython global alignment (BLOSUM62, gaps 11/1, free end gaps)."""
    from Bio import Align
    from Bio.Align import substitution_matrices

    aligner = Align.PairwiseAligner(mode="global", substitution_matrix=substitution_matrices.load("BLOSUM62"),
                                    open_gap_score=-11, extend_gap_score=-1)
    aligner.end_gap_score = 0
    alignment = aligner.align(seq_a, seq_b)[0]
    index = {}
    for (a0, a1), (b0, _) in zip(*alignment.aligned):
        for k in range(a1 - a0):
            index[b0 + k] = a0 + k
    return index


def renumbered_native(model: list, native: list) -> list:
    """The native numbered like the model through the alignment; unaligned residues get numbers >= 9000."""
    index = sequence_alignment("".join(THREE.get(r[0], "X") for r in model),
                               "".join(THREE.get(r[0], "X") for r in native))
    return [(r[0], model[index[i]][1] if i in index else 9000 + i, "", r[3]) for i, r in enumerate(native)]


if __name__ == "__main__":
    main()
