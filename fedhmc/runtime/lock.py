"""One process per output folder: an exclusive lock (``.lock``) on a run, sweep or
experiment folder.

A second process that wants the folder is refused with one line naming the process that
holds it. The lock is an ``flock`` on the file, so the operating system releases it when its
holder ends, however it ends (``kill -9`` included); the next process takes it over and says
so. A command that is refused before it starts removes the lock file, and the folder when
it created it, so that nothing is left behind.

The lock is taken only on a folder that is fedhmc's to write: a new or empty one, or one that
holds fedhmc's marker (`fedhmc.runtime.output.check_out_folder`); the root folder, the
home folder and a folder of the user's own files are refused before anything is written.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fedhmc.errors import ConfigError
from fedhmc.runtime.output import LOCK_NAME, MARKER, check_out_folder, refuse_links

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _holder(text: str) -> tuple[str, str]:
    """(process id, what it does) from a lock file's text: ``process 123`` and, on the next
    line, what the holder said it is (``a run``, ``a sweep``); ``another process`` and ``a
    fedhmc command`` where the text does not say (a lock file cut short)."""
    lines = text.strip().splitlines()
    first = lines[0].split() if lines else []
    pid = first[-1] if len(first) >= 2 and first[0] == "process" else "another process"
    what = lines[1].strip() if len(lines) > 1 and lines[1].strip() else "a fedhmc command"
    return pid, what


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FolderLock:
    """An exclusive lock on ``folder`` (its ``.lock`` file), held until ``release``.

    Parameters
    ----------
    folder
        The run, sweep or experiment folder (created if missing).
    what
        What this process does there ("a run", "a sweep"), written into the lock file so
        that another process refused by it names the holder's work truthfully.
    """

    _held: set[Path] = set()  # the folders this process holds, resolved

    @classmethod
    def held(cls, folder: str | os.PathLike) -> bool:
        """Whether this process holds the lock on ``folder`` already (a command that locks
        its folder calls code that would lock it too: that code takes no second lock)."""
        return Path(folder).resolve() in cls._held

    def __init__(self, folder: str | os.PathLike, what: str = "a run"):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.what = what
        self._f = None
        self._made_folder = False

    def acquire(self) -> FolderLock:
        import fcntl

        try:
            self._made_folder = not self.folder.exists()
            self.folder.mkdir(parents=True, exist_ok=True)
            refuse_links(self.folder)  # a planted .lock (or run file) is never followed
            check_out_folder(self.folder)  # nothing written where the user's files are
            while True:
                f = self._open()
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.seek(0)
                    pid, what = _holder(f.read())
                    f.close()
                    self._forget_folder()
                    raise ConfigError(
                        f"{self.folder} is in use by process {pid} ({what} still going); "
                        f"wait for it to end or stop it (kill {pid}), or choose another --out"
                    ) from None
                # The file may have been removed by its last holder between our open and our
                # lock: then we hold a lock on a file nobody else sees. Try again.
                try:
                    same = os.fstat(f.fileno()).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                f.close()
        except OSError as e:
            raise ConfigError(
                f"cannot write to --out {str(self.folder)!r} ({e.strerror or e})"
            ) from None
        f.seek(0)
        before = f.read().strip()
        if before.startswith("process "):
            pid, _ = _holder(before)
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                print(
                    f"fedhmc: note: {self.folder} was left locked by process {pid}, which is "
                    "no longer running; taking it over",
                    file=sys.stderr,
                )
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()}\n{self.what}\n")
        f.flush()
        self._f = f
        FolderLock._held.add(self.folder.resolve())
        return self

    def _open(self):
        """The lock file, created if missing, opened without following a symbolic link
        (closed in ``release``)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
        except OSError:
            if self.path.is_symlink():
                refuse_links(self.folder, (LOCK_NAME,))
            raise
        return os.fdopen(fd, "r+")

    def release(self, discard: bool = False) -> None:
        """Give the folder back. The lock file goes (and, with ``discard``, the folder too
        when this lock created it and it is empty again: a refused command leaves nothing)."""
        import fcntl

        if self._f is None:
            return
        FolderLock._held.discard(self.folder.resolve())
        try:
            self.path.unlink(missing_ok=True)
        finally:
            fcntl.flock(self._f, fcntl.LOCK_UN)
            self._f.close()
            self._f = None
        if discard:
            self._forget_folder()

    def _forget_folder(self) -> None:
        if self._made_folder:
            try:
                if [p.name for p in self.folder.iterdir()] == [MARKER]:
                    (self.folder / MARKER).unlink()  # marked, then refused: nothing stays
                self.folder.rmdir()  # only if empty
            except OSError:
                pass

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False
