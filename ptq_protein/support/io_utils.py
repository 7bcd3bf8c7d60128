"""Safe file and folder writes: nothing already written is lost, half-written or raced over.

- :func:`atomic_write_bytes` / :func:`atomic_write_text` / :func:`atomic_file`: temp
  file in the same folder, fsync, rename. The file gets the permissions of any new
  file (the umask applies), not ``mkstemp``'s private 0600.
- :func:`atomic_dir`: build a folder beside its destination, then rename it into
  place. Without ``force`` the final rename itself refuses an existing
  destination, so two writers racing to one path cannot both "succeed". With
  ``force`` only a destination that ``replaceable(path)`` recognises is replaced.
  Temp folders left by killed processes (their pid is in the name) are removed.
- :func:`check_out_path`: refuse an unusable output path (``""``, ``.``, under a
  regular file, an unwritable parent) before any expensive work starts.
- :func:`safe_stem`: ids -> collision-free file names.
- Locks (also see :mod:`ptq_protein.eval.bench.results_store`, which uses them)::

      with folder_lock(out_dir):          # one run per folder: a second one is refused
          ...
      with file_lock(path.with_suffix(".lock"), wait=True):   # short critical section, any number of processes
          ...

  Both are ``fcntl.flock`` locks on a small file holding the holder's pid and
  host. The kernel drops a flock when its process dies, so a lock file left by
  a killed run is *stale by construction*: the next run takes it (and logs the
  old holder). :func:`folder_lock` refuses with :class:`~ptq_protein.support.errors.BusyError`
  naming the holder while it is held; :func:`file_lock` with ``wait=True``
  blocks instead (use it for read-merge-write of a shared file, as
  ``ResultsStore.put`` does, so several processes can add keyed rows to one table).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from ptq_protein.support.errors import BusyError, InputError

PathLike = Union[str, os.PathLike]

__all__ = ["public_source", "atomic_write_text", "atomic_write_bytes", "atomic_file", "atomic_dir", "check_out_path",
           "safe_stem", "folder_lock", "file_lock", "open_lock_file", "LOCK_NAME", "current_umask", "env_flag"]

logger = logging.getLogger(__name__)

LOCK_NAME = ".ptq-protein.lock"
_TMP_RE = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)-")


def public_source(value: Any) -> Any:
    """What a shared file may say about where a model came from: a local path's last component only.

    ``/home/alice/models/esm`` -> ``esm``; Hub ids (``facebook/esm2_t6_8M_UR50D``), ``tiny:...`` sources and
    non-strings are kept. Artifacts go to the Hub (``push_to_hub``): they must not carry private paths.
    """
    if not isinstance(value, str) or not value or value.startswith("tiny:"):
        return value
    text = os.path.expanduser(value)
    hub_id = value.count("/") == 1 and not value.startswith((".", "/", "~"))
    if os.path.isabs(text) or value.startswith(("~", "./", "../")) or (os.sep in value and not hub_id):
        return Path(text).name or value
    if hub_id and Path(text).exists():  # a relative local folder that looks like a Hub id
        return Path(text).name
    return value


def current_umask() -> int:
    """The process umask, read without changing it where /proc allows (os.umask is a set-and-get)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder, then rename.

    An ``OSError`` (a full disk, a folder that takes no files) names ``path``, not the temp file.
    """
    with atomic_file(path) as tmp, open(tmp, "wb") as handle:
        handle.write(data)


@contextlib.contextmanager
def atomic_file(path: PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``path`` for a writer that wants a file name (h5py); on success it gets the
    umask's permissions, is synced and renamed to ``path``; on any error it is removed and ``path`` untouched.

    An ``OSError`` names ``path``, not the temp file.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent)
        os.close(fd)
    except OSError as err:
        raise type(err)(err.errno, err.strerror, str(path)) from err
    try:
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fchmod(fd, 0o666 & ~current_umask())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.errno is not None:
            raise type(err)(err.errno, err.strerror, str(path)) from err
        raise


def atomic_write_text(path: PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_dir(path: PathLike, force: bool = False,
               replaceable: Optional[Callable[[Path], bool]] = None, what: str = "folder") -> Iterator[Path]:
    """Yield a temp folder beside ``path``; on success it is renamed to ``path``.

    An existing ``path`` is kept unless ``force``; with ``force`` it is replaced only
    when ``replaceable(path)`` is true (``what`` names the kind in the refusal). The
    final rename refuses a ``path`` that appeared meanwhile (another process), so
    the check and the rename cannot race. On any error the temp folder is removed
    and ``path`` is untouched.
    """
    path = Path(path)
    check_out_path(path, force=force, replaceable=replaceable, what=what)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent))
    os.chmod(tmp, 0o777 & ~current_umask())
    try:
        yield tmp
        _umask_permissions(tmp)
        _move_into_place(tmp, path, force, replaceable, what)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask_permissions(folder: Path) -> None:
    """Give every file under ``folder`` the mode a plain ``open`` would (some writers, e.g. safetensors, use 0600)."""
    mask = current_umask()
    for entry in folder.rglob("*"):
        if not entry.is_symlink():
            os.chmod(entry, (0o777 if entry.is_dir() else 0o666) & ~mask)


def _move_into_place(tmp: Path, path: Path, force: bool, replaceable, what: str) -> None:
    if force and path.exists():
        check_out_path(path, force=True, replaceable=replaceable, what=what)  # still ours, right now
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-{os.getpid()}-", dir=path.parent))
        os.replace(path, old / "x")
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.rename(tmp, path)  # fails on an existing non-empty folder or a file: no silent replacement
    except OSError as err:
        if err.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            raise FileExistsError(f"{path} was created by another process while this one was writing; nothing was "
                                  "replaced: choose another path, or pass --force (force=True) to replace it") from err
        raise


def clean_stale_temps(path: PathLike) -> None:
    """Remove ``.<name>.tmp-<pid>-*`` / ``.old-`` siblings of ``path`` whose process is gone (a killed run's)."""
    path = Path(path)
    if not path.parent.is_dir():
        return
    for entry in path.parent.glob(f".{path.name}.*"):
        match = _TMP_RE.match(entry.name)
        if match and match["name"] == path.name and not _pid_alive(int(match["pid"])):
            logger.info("removing %s, left by a run (pid %s) that did not finish", entry, match["pid"])
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()


def check_out_path(path: PathLike, force: bool = False, replaceable: Optional[Callable[[Path], bool]] = None,
                   what: str = "folder") -> None:
    """Refuse, in words, an output path that cannot or must not be written (call it before long work).

    Raises :class:`~ptq_protein.support.errors.InputError` for ``""``/``.``/a path under a
    regular file/an unwritable parent, and ``FileExistsError`` for an existing path
    without ``force`` or one ``replaceable`` does not recognise.
    """
    text = str(path)
    path = Path(path)
    if not text.strip() or path.resolve() == Path.cwd().resolve() or path.name in ("", ".", ".."):
        raise InputError(f"output path {text!r} names no new {what}; give a folder name such as runs/my-run")
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"cannot write {path}: {parent} is a regular file, not a folder; choose another path")
            why = _unwritable(parent)
            if why:
                raise InputError(f"cannot write {path}: {parent} does not take new files ({why}); choose another path")
            break
    if path.exists() or path.is_symlink():
        if not force:
            raise FileExistsError(f"{path} already exists; choose another path or pass --force (force=True) to "
                                  "replace it")
        if path.is_symlink() or (replaceable is not None and not replaceable(path)):
            raise FileExistsError(f"{path} exists and is not a {what} written by ptq-protein; --force only replaces "
                                  "those: move it away or choose another path")


def _unwritable(folder: Path) -> Optional[str]:
    """Why a file cannot be made in ``folder`` (None: it can). A real probe: ``os.access`` says yes to root
    everywhere, and ``/proc`` or a read-only mount refuse only the write itself."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return "not writable"
    try:
        fd, probe = tempfile.mkstemp(prefix=".ptq-protein-probe-", dir=folder)
    except OSError as err:
        return err.strerror or type(err).__name__
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def safe_stem(identifier: str) -> str:
    """A file-name stem for an id, distinct for distinct ids.

    Ids made only of letters, digits, ``.``, ``_`` and ``-`` (and not starting
    with ``.``) are used as they are; any other id gets its unsafe characters
    replaced by ``_`` and a stable suffix from its sha1 (``a/b`` -> ``a_b~3f1c2a9b``),
    so ``a/b`` and ``a_b`` never write the same file. ``~`` never appears in a
    kept id, so a suffixed stem cannot equal a kept one.
    """
    text = str(identifier)
    cleaned = "".join(c if c.isalnum() and c.isascii() or c in "._-" else "_" for c in text)
    if cleaned == text and text and not text.startswith(".") and len(text) <= 120:
        return text
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]
    return f"{cleaned.lstrip('.')[:100] or 'id'}~{digest}"


@contextlib.contextmanager
def file_lock(path: PathLike, wait: bool = True, purpose: str = "this file") -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed) for the ``with`` block.

    ``wait=False`` refuses at once with :class:`BusyError` naming the holder's pid
    and host when another process holds it.
    """
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_lock_file(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError as err:
            holder = _holder_soon(fd) or "another process"
            raise BusyError(f"{purpose} is in use by {holder} (lock {path}); wait for that run to finish, or use "
                            "another output folder") from err
        previous = _read_holder(fd)
        if previous and not wait:
            logger.info("lock %s was left by %s, which is gone (stale lock); taking it", path, previous)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def open_lock_file(path: PathLike) -> int:
    """Open (create) the lock file ``path`` read-write, never through a link: the holder line truncates it, so
    a lock name planted as a link (or a hard link) would empty or create the file it names, outside the folder.

    Refuses a symbolic link, a hard-linked file or anything but a regular file with an :class:`InputError`.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        raise InputError(f"lock file {path} is a link; remove it (a lock file is a plain file ptq-protein creates, "
                         "and a link would make this run write where it points)") from err
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        what = "a hard link to another file" if stat.S_ISREG(info.st_mode) else "not a plain file"
        raise InputError(f"lock file {path} is {what}; remove it (ptq-protein creates its own lock files)")
    return fd


@contextlib.contextmanager
def folder_lock(folder: PathLike) -> Iterator[None]:
    """One run per output folder: refuse (:class:`BusyError`) while another process holds ``folder``."""
    folder = Path(folder)
    with file_lock(folder / LOCK_NAME, wait=False, purpose=f"output folder {folder}"):
        yield


def _holder_soon(fd: int, tries: int = 20) -> str:
    """The holder line, waiting up to ~0.2 s: the holder writes it just after taking the lock."""
    import time

    for _ in range(tries):
        holder = _read_holder(fd)
        if holder:
            return holder
        time.sleep(0.01)
    return ""


def _read_holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    return ""


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_YES, _NO = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """A yes/no environment variable: ``1/true/yes/on`` and ``0/false/no/off`` (or unset); anything else refused."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in _YES or value in _NO:
        return value in _YES
    raise InputError(f"{name}={raw!r} is not a yes/no value; set it to 1 or 0, or unset it")
