"""What the cases of ``audit_outputs.py`` share: the case registry, the CLI run in a subprocess (6 GiB of address
space), tiny inputs, reading an output folder back and judging a refusal."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

SEQS = {"a": "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ", "b": "MENDELKKLLAAGHRW", "c": "ACDEFGHIKLMNPQRSTVWYACDEFGHIKL"}
CASES: List[Tuple[str, str, Callable[[Path], Tuple[str, bool]]]] = []


def case(name: str, expected: str):
    def register(fn):
        CASES.append((name, expected, fn))
        return fn
    return register


# --- helpers ---------------------------------------------------------------------------------------------------


class Ran:
    def __init__(self, rc: int, out: str, err: str, seconds: float):
        self.rc, self.out, self.err, self.seconds = rc, out, err, seconds

    @property
    def one_line(self) -> bool:
        lines = [line for line in self.err.strip().splitlines() if line.strip()]
        return len(lines) == 1 and "Traceback" not in self.err

    def said(self) -> str:
        text = " | ".join(line.strip() for line in self.err.strip().splitlines()[-2:])
        return f"exit {self.rc}" + (f": {text[:300]}" if text else "")


def _memory_cap() -> None:
    """At most 6 GiB of address space: a read of ``/dev/zero`` fails with MemoryError instead of filling the machine."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def cli(work: Path, *args, env: Optional[Dict[str, str]] = None, timeout: float = 300) -> Ran:
    """``ptq-protein ARGS --quiet`` in ``work``, with this interpreter's ptq-protein (6 GiB of address space)."""
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "ptq_protein.cli.main", *map(str, args)], cwd=work,
                              capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
                              preexec_fn=_memory_cap)
    except subprocess.TimeoutExpired:
        return Ran(124, "", f"still running after {timeout:.0f} s (killed)", timeout)
    return Ran(done.returncode, done.stdout, done.stderr, time.perf_counter() - start)


def embed(work: Path, model, fasta, out, *extra, env=None) -> Ran:
    return cli(work, "embed", model, fasta, "--out", out, *extra, "--quiet", env=env)


def fasta(work: Path, seqs: Dict[str, str] = SEQS, name: str = "seqs.fasta") -> Path:
    path = work / name
    path.write_text("".join(f">{k}\n{v}\n" for k, v in seqs.items()))
    return path


def read(out: Path):
    """``read_embeddings(out)`` or the exception it raised."""
    from ptq_protein import read_embeddings

    try:
        return read_embeddings(out)
    except Exception as err:  # noqa: BLE001 -- what a user sees is the point
        return err


def max_diff(a: dict, b: dict, key: str = "mean_representations") -> float:
    return max(float((a[k][key][layer] - b[k][key][layer]).abs().max()) for k in a for layer in a[k][key])


def read_ok(got, want: dict, name: str) -> Tuple[str, bool]:
    """A read that returns ``want`` exactly, or refuses naming ``name`` (one clear error, not a raw one)."""
    from ptq_protein.support.errors import InputError

    if isinstance(got, Exception):
        clear = isinstance(got, (InputError, ValueError)) and name in str(got)
        return f"read raised {type(got).__name__}: {str(got)[:120]}", clear
    if set(got) != set(want):
        return f"read returned {sorted(got)}, want {sorted(want)}", False
    diff = max_diff(got, want)
    return f"read max diff {diff:.3g}", diff == 0


def refused(ran: Ran, *names: str) -> bool:
    return ran.rc == 2 and ran.one_line and all(n in ran.err for n in names)


def write_fair_esm2(path: Path, seed: int = 0) -> Path:
    """A tiny fair-esm ESM-2 as fair-esm's hub files: ``NAME.pt`` and ``NAME-contact-regression.pt``."""
    import torch

    from ptq_protein.models.tiny import tiny_esm2

    try:
        from ptq_protein.models.fair_esm2 import save_fair_esm2
    except ImportError:  # a release before it: the same layout, written here
        return _write_fair_esm2_here(tiny_esm2(seed=seed)[0], path, torch)
    return save_fair_esm2(tiny_esm2(seed=seed)[0], path)


def _write_fair_esm2_here(model, path: Path, torch) -> Path:
    import argparse as ap

    state = model.state_dict()
    body = {("encoder." if k.startswith("lm_head.") else "encoder.sentence_encoder.") + k: v
            for k, v in state.items() if not k.startswith("contact_head.")}
    cfg = ap.Namespace(encoder_layers=model.num_layers, encoder_embed_dim=model.embed_dim,
                       encoder_attention_heads=model.attention_heads, token_dropout=model.token_dropout)
    torch.save({"model": body, "cfg": {"model": cfg}}, path)
    torch.save({"model": {k: v for k, v in state.items() if k.startswith("contact_head.")}},
               path.with_name(f"{path.stem}-contact-regression.pt"))
    return path
