"""Reading files a user can hand us (or edit): JSON, gzip, CSV. Every failure is one ``InputError`` naming the file.

Python's own errors for these name no file and are not ``ValueError`` s: a 100k-deep JSON
nesting raises ``RecursionError``, a corrupt deflate stream ``zlib.error``, a 200 kB CSV cell
``csv.Error``; the CLI would report them as crashes (exit 1) without saying which file.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from ptq_protein.support.errors import InputError

__all__ = ["regular_file", "read_json", "gunzip", "read_csv"]

_GZIP_ERRORS = (OSError, EOFError, zlib.error)


def regular_file(path: Union[str, os.PathLike], what: str) -> Path:
    """``path`` when it is a regular file; else "not found", or "not a regular file" for a folder or device
    (``/dev/zero`` would be read forever)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} not found: {path}")
    if not path.is_file():
        kind = "a folder" if path.is_dir() else "a device or pipe"
        raise InputError(f"{what} {path} is {kind}, not a regular file; give the path of the file")
    return path


def read_json(path: Union[str, os.PathLike], fix: str) -> Any:
    """The JSON value in ``path``; unreadable JSON (syntax, UTF-8, nesting too deep) names ``path`` and ``fix``."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.loads(handle.read())
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        why = "nested too deeply" if isinstance(err, RecursionError) else " ".join(str(err).split())[:120]
        raise InputError(f"{path} is not readable JSON ({why}); {fix}") from err


def gunzip(data: bytes, label: str, fix: str, error: type = InputError) -> bytes:
    """``data`` decompressed; a truncated or corrupt stream raises ``error`` naming ``label`` and ``fix``."""
    try:
        return gzip.decompress(data)
    except _GZIP_ERRORS as err:
        raise error(f"{label}: truncated or corrupt gzip file ({' '.join(str(err).split())[:120]}); {fix}") from err


def read_csv(text: str, label: str, fix: str) -> Tuple[List[str], List[Dict[str, Optional[str]]]]:
    """(header, rows) of CSV ``text`` as ``csv.DictReader`` reads them; a malformed file names ``label``.

    A cell over ``csv.field_size_limit()`` (128 KiB) or a NUL byte is a damaged table, not a row to keep.
    """
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = list(reader.fieldnames or ())
        return header, list(reader)
    except csv.Error as err:
        raise InputError(f"{label} line {reader.line_num + 1}: {err}; {fix}") from err  # the line being read
