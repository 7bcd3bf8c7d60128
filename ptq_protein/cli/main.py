"""Entry point of ``ptq-protein``: builds the sub-command parsers and maps errors to exit codes.

Each sub-command lives in its own module of this package exposing
``register(subparsers)``; heavy imports (torch, transformers) happen inside the
command functions so that ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Callable, Optional, Sequence

from ptq_protein import __version__
from ptq_protein.cli.common import printable
from ptq_protein.support.process_memory import managed_heap

# module name -> sub-commands it registers; order is the order shown in --help.
_COMMAND_MODULES = (
    "ptq_protein.cli.quantize_cmd",
    "ptq_protein.cli.presets_cmd",
    "ptq_protein.cli.fold_cmd",
    "ptq_protein.cli.embed_cmd",
    "ptq_protein.cli.score_cmd",
    "ptq_protein.cli.inspect_cmd",
    "ptq_protein.cli.eval_cmd",
    "ptq_protein.cli.sensitivity_cmd",
    "ptq_protein.cli.structure_cmds",
    "ptq_protein.cli.export_cmd",
)

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (no usage block first), exit code 2; sub-parsers inherit the class."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ptq-protein",
        description="Post-training quantization of ESM-2 / ESMFold, and structure evaluators.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'ptq-protein COMMAND --help' for the options and examples of each command.",
    )
    parser.add_argument("--version", action="version", version=f"ptq-protein {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:  # a command module not present in this build
            if err.name != name:
                raise
            continue
        module.register(subparsers)
    return parser


def _one_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return printable(" ".join(text.split()))


class _PrintableFormatter(logging.Formatter):
    """Log lines as :func:`printable` text: an id holding ESC or BEL cannot drive the terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(printable(line) for line in super().format(record).split("\n"))


def _route_library_noise() -> None:
    """Library warnings as one logging line each (no source echo); no download bars when stderr is not a terminal."""
    import os
    import warnings

    def show(message, category, filename, lineno, file=None, line=None):
        logging.getLogger("py.warnings").warning("%s: %s", category.__name__, " ".join(str(message).split()))

    warnings.showwarning = show
    if not sys.stderr.isatty():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when transformers is first imported


def _check_environment() -> None:
    """The environment variables the library reads, checked before any work: a bad value read later would
    fail every row of a run (each recorded as an error) instead of the command."""
    from ptq_protein.support.env_settings import check_environment

    check_environment()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    level = logging.WARNING if getattr(args, "quiet", False) else logging.INFO
    handler = logging.StreamHandler()
    handler.setFormatter(_PrintableFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    _route_library_noise()
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        _check_environment()
        with managed_heap():  # freed blocks returned while loading, kept for reuse while computing (process_memory)
            return int(func(args) or EXIT_OK)
    except KeyboardInterrupt:
        print("ptq-protein: interrupted", file=sys.stderr)
        return EXIT_RUNTIME
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError) as err:
        if args.debug:
            raise
        print(f"ptq-protein {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as err:  # runtime failure: one line, traceback only with --debug
        if args.debug:
            raise
        said = _disk_full(err) or f"{type(err).__name__}: {_one_line(err)}"
        print(f"ptq-protein {args.command}: failed: {said}", file=sys.stderr)
        return EXIT_RUNTIME


def _disk_full(err: BaseException) -> str:
    """A write that ran out of disk (or of a quota or file-size limit), in words; "" for any other error."""
    import errno

    if not isinstance(err, OSError) or err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return ""
    where = f"writing {err.filename}" if err.filename else "writing"
    return printable(f"{where}: {err.strerror} (the disk holding it is full, or a quota or file-size limit was "
                     "reached); free space there or choose another output folder, then rerun: files already "
                     "written are kept and not computed again")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
