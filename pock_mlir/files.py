"""Every file pock-mlir writes goes through here: atomically, and never through a planted link.

A file is written to a temporary file created beside it with a unique name (O_CREAT|O_EXCL, so
a symlink or file planted under any name is never opened), fsynced, renamed over the target
(os.replace replaces a symlink itself, never what it points to) and the directory fsynced: a
crash, a kill or Ctrl-C leaves the old file or the new one, and no temporary file. A directory
(a bundle) is staged the same way, in a fresh directory beside it. Errors name the path.

A path that is a character device (/dev/null, a terminal) or a FIFO is written through, opened
and written as mlir-opt does: renaming a file over it would replace the device itself (a
/dev/null turned regular file breaks the system's tools). Other special files (a block device,
a socket) and a directory to be written over any of them are refused.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import tempfile
from pathlib import Path

TEMPORARY_PREFIX = ".pock-tmp-"  # every temporary name starts so; `is_temporary` recognises them


class OutputError(OSError):
    """An output path that cannot be written, named with the reason."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_directory(directory) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _special_kind(path: Path) -> str | None:
    """What `path` is if it is neither a regular file, a directory, a symlink nor absent."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    kinds = {
        stat.S_ISCHR: "a character device",
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    return next((kind for test, kind in kinds.items() if test(mode)), None)


WRITTEN_THROUGH = ("a character device", "a FIFO")


def _write_through(path: Path, data: bytes) -> bool:
    """Write `data` into the device or FIFO at `path`; False if it is no longer one (then the
    caller writes a regular file). Blocks, as any writer of a FIFO does, until it has a reader."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NOCTTY)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):  # swapped since it was looked at
            return False
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    return True


def atomic_write(path, data: bytes | str) -> None:
    """Replace `path` with `data` (see the module docstring). The file gets the permissions a
    plain open() would give it (0666 less the umask). A character device or FIFO is written through."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    check_writable(path)
    if _special_kind(path) in WRITTEN_THROUGH and _write_through(path, data):
        return
    with _replacing(path) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_file(path):
    """A binary file whose contents replace `path` as atomic_write's data does when the block ends,
    for what is written piece by piece without holding it whole; nothing changes at `path` if the
    block raises. A character device or FIFO is written through at the end, from memory."""
    path = check_writable(Path(path))
    if _special_kind(path) in WRITTEN_THROUGH:
        buffer = io.BytesIO()
        yield buffer
        atomic_write(path, buffer.getvalue())
        return
    with _replacing(path) as f:
        yield f


@contextlib.contextmanager
def _replacing(path: Path):
    """A temporary file beside `path` to write, fsynced and renamed over `path` when the block ends."""
    fd, staged = tempfile.mkstemp(prefix=f"{TEMPORARY_PREFIX}{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(staged, path)
    except BaseException as e:  # Ctrl-C included: leave no partial file behind
        Path(staged).unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, OutputError):
            raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
        raise
    fsync_directory(path.parent)


def atomic_save(path, write) -> None:
    """atomic_write of what `write(file_object)` writes (np.savez, savefig, ...)."""
    buffer = io.BytesIO()
    write(buffer)
    atomic_write(path, buffer.getvalue())


def check_writable(path) -> Path:
    """Refuse, before any work, an output file path that cannot be written: a directory, a block
    device or socket, a missing or unwritable parent directory. A character device or FIFO needs
    only to be writable itself (it is written through)."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a directory; give a file name")
    kind = _special_kind(path)
    if kind in WRITTEN_THROUGH:
        if not os.access(path, os.W_OK):
            raise OutputError(f"cannot write {path}: {kind} this user may not write to")
        return path
    if kind is not None:
        raise OutputError(f"cannot write {path}: it is {kind}; give a file name")
    parent = path.parent
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {path}: directory {parent} is not writable")
    return path


def staging_directory(destination) -> Path:
    """A fresh, empty directory beside `destination` to build it in (same filesystem, so it can
    be renamed into place), with the permissions a plain mkdir would give it. A destination that
    is a device, FIFO or other special file is refused: putting the directory in place would replace it."""
    destination = Path(destination)
    kind = _special_kind(destination)
    if kind is not None:
        raise OutputError(f"cannot write the directory {destination}: it is {kind}; give a directory name")
    staged = Path(tempfile.mkdtemp(prefix=f"{TEMPORARY_PREFIX}{destination.name}.", dir=destination.parent))
    staged.chmod(0o777 & ~_umask())  # mkdtemp makes it 0700; a bundle is meant to be copied and shared
    return staged


def is_temporary(name: str) -> bool:
    return name.startswith(TEMPORARY_PREFIX)
