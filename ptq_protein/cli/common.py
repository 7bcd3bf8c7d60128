"""Options shared by several sub-commands (device, dtype, seed, json, quiet)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple


def printable(text: str) -> str:
    """``text`` with control characters (ESC, BEL, ...) written as escapes: ids reach the terminal inert."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def add_runtime_options(parser: argparse.ArgumentParser) -> None:
    """--device/--dtype/--seed/--quiet, as every model-running command takes them."""
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"], help="where to run (default: cpu)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                        help="floating-point dtype of the parts kept in floating point (default: float32)")
    parser.add_argument("--seed", type=int, help="random seed: the weights of tiny models, sampling (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars, warnings only")


def add_duplicates_option(parser: argparse.ArgumentParser) -> None:
    """--duplicates, for commands that read a FASTA of many sequences (embed, fold)."""
    parser.add_argument("--duplicates", choices=["error", "rename"], default="error",
                        help="a repeated FASTA id: refuse the file (default), or rename the k-th repeat <id>#k")


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is visible; use --device cpu or auto")
    return name


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def input_notes(records: Iterable[Tuple[str, str]], changes: Mapping[str, str],
                more: Optional[Callable[[str], str]] = None) -> Dict[str, str]:
    """name -> one line saying what reading (``changes``, as ``read_fasta`` fills it) and ``more(sequence)`` (what
    the model itself changes) did to that sequence; only sequences something changed."""
    notes = {}
    for name, seq in records:
        said = [n for n in (changes.get(name, ""), more(seq) if more else "") if n]
        if said:
            notes[name] = f"{name}: " + "; ".join(said)
    return notes


def say_input_changes(command: str, notes: Mapping[str, str]) -> None:
    """One stderr line per changed sequence (:func:`input_notes`)."""
    for line in notes.values():
        print(f"ptq-protein {command}: {line}", file=sys.stderr)


def show_progress(args: argparse.Namespace) -> bool:
    """Progress unless ``--quiet``: a bar at a terminal, log lines with an ETA otherwise
    (``ptq_protein.support.progress``)."""
    return not getattr(args, "quiet", False)


# On CPU, ESMFold's triangle attention (cubic in length) makes long calibration
# sequences dominate; cropping them to a central window keeps calibration fast.
CPU_CALIB_MAX_LENGTH = 128


def add_calib_crop_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calib-max-length", type=int, metavar="N",
                        help="crop longer calibration sequences to their central N residues; 0 keeps them whole, as "
                             f"the study did (default: {CPU_CALIB_MAX_LENGTH} on CPU, whole sequences on CUDA)")


def calib_crop(args: argparse.Namespace, device) -> "int | None":
    """The crop length for ``pp.quantize(calib_max_length=...)`` (None: keep whole)."""
    if args.calib_max_length is not None:
        if args.calib_max_length < 0:
            raise ValueError(f"--calib-max-length {args.calib_max_length} must be 0 (no crop) or positive")
        return args.calib_max_length or None
    return CPU_CALIB_MAX_LENGTH if str(device).startswith("cpu") else None


def add_batch_size_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, metavar="N",
                        help="calibration batch size (default: 1 for ESMFold, whose pair tensors make padding costly, "
                             "as the study calibrated; 4 for language models)")


def add_tm_normalize_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tm-normalize", default="native", choices=["native", "sequence"],
                        help="TM-score/GDT length: the native's observed residues (default; 'TMscore MODEL NATIVE') "
                             "or the prediction's full sequence ('TMscore NATIVE MODEL', as the study ran it)")


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_SIZE_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_memory_size(text: Optional[str], option: str = "--max-memory") -> Optional[int]:
    """Bytes of a size like ``16G``, ``16GiB``, ``512M`` or plain bytes (binary units: G = 2^30)."""
    if text is None:
        return None
    match = _SIZE.match(text)
    size = int(float(match.group(1)) * 1024 ** _SIZE_POWERS[match.group(2).lower()]) if match else 0
    if size < 1:  # "0.5" is half a byte: 0 once whole
        raise ValueError(f"{option} {text!r} is not a memory size of at least one byte; write e.g. 16G, 512M or "
                         "2.5GiB")
    return size


def memory_size(text: str) -> int:
    """``type=`` of a ``--max-memory`` option: the size refused by the parser, before any model loads."""
    try:
        return parse_memory_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).replace("--max-memory ", "", 1)) from err
