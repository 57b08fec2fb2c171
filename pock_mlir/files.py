"""Every file pock-mlir writes goes through here: atomically, and never through a planted link.

A file is written to a temporary file created beside it with a unique name (O_CREAT|O_EXCL, so
a symlink or file planted under any name is never opened), fsynced, renamed over the target
(os.replace replaces a symlink itself, never what it points to) and the directory fsynced: a
crash, a kill or Ctrl-C leaves the old file or the new one, and no temporary file. A directory
(a bundle) is staged the same way, in a fresh directory beside it. Errors name the path.
"""

from __future__ import annotations

import io
import os
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


def atomic_write(path, data: bytes | str) -> None:
    """Replace `path` with `data` (see the module docstring). The file gets the permissions a
    plain open() would give it (0666 less the umask)."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    check_writable(path)
    fd, staged = tempfile.mkstemp(prefix=f"{TEMPORARY_PREFIX}{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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
    """Refuse, before any work, an output file path that cannot be written: a directory, a
    missing or unwritable parent directory."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a directory; give a file name")
    parent = path.parent
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {path}: directory {parent} is not writable")
    return path


def staging_directory(destination) -> Path:
    """A fresh, empty directory beside `destination` to build it in (same filesystem, so it can
    be renamed into place), with the permissions a plain mkdir would give it."""
    destination = Path(destination)
    staged = Path(tempfile.mkdtemp(prefix=f"{TEMPORARY_PREFIX}{destination.name}.", dir=destination.parent))
    staged.chmod(0o777 & ~_umask())  # mkdtemp makes it 0700; a bundle is meant to be copied and shared
    return staged


def is_temporary(name: str) -> bool:
    return name.startswith(TEMPORARY_PREFIX)
