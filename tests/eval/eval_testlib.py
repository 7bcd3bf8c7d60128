"""Helpers shared by the structure-evaluator tests (hand-built coordinates and PDB text)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data"
STRUCTURES = DATA / "structures"
FULL_NATIVE = STRUCTURES / "7TV9.full.pdb.gz"  # cameo139 7TV9 chain C, 63 residues, all atoms


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    """A uniformly random proper rotation [3, 3]."""
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def random_walk(n: int, seed: int, step: float = 3.8) -> np.ndarray:
    """A compact-ish CA trace [n, 3]: a random walk with steps of ``step`` Å."""
    rng = np.random.default_rng(seed)
    steps = rng.normal(size=(n, 3))
    steps *= step / np.linalg.norm(steps, axis=1, keepdims=True)
    return np.cumsum(steps, axis=0)


def pdb_lines(residues, chain: str = "A", record: str = "ATOM") -> list:
    """PDB ATOM lines for ``residues`` = [(resname, number, icode, [(atom, xyz), ...]), ...]."""
    lines, serial = [], 1
    for resname, number, icode, atoms in residues:
        for name, (x, y, z) in atoms:
            padded = f" {name:<3}" if len(name) < 4 else name
            lines.append(f"{record:<6}{serial:>5} {padded:<4} {resname:>3} {chain}{number:>4}{icode or ' ':1}   "
                         f"{x:8.3f}{y:8.3f}{z:8.3f}  1.00  0.00           {name[0]:>1}")
            serial += 1
    return lines


def ca_residues(ca: np.ndarray, start: int = 1, resname: str = "ALA") -> list:
    return [(resname, start + i, "", [("CA", xyz)]) for i, xyz in enumerate(ca)]
