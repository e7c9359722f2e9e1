"""One writer per run folder: an advisory lock (``fcntl.flock``) on ``RUN_DIR/.lock`` held while a run trains.

A second training into the same folder is refused at start with :class:`RunFolderInUse`, which names the folder
and the process holding it. The operating system drops the lock when its holder exits, however it exits (SIGKILL,
crash, preemption), so a stale lock never blocks a later run; the ``.lock`` file itself stays (it only holds the
last holder's pid), unless the run created the folder and wrote nothing else there (a run that failed at start).

Under ``accelerate launch`` the main process takes the lock and tells the others whether it got it, so every
process of a refused launch stops with the same error.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["LOCK_FILE", "RunFolderInUse", "run_folder_lock"]

LOCK_FILE = ".lock"


class RunFolderInUse(OSError):
    """Another process trains into this run folder."""


def _holder(path: Path) -> str:
    """What the lock file says about its holder ("pid N on HOST"), or a neutral phrase when it says nothing yet."""
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return text or "another process"


def _acquire(run_dir: Path) -> int:
    """Take the lock of ``run_dir`` (created if missing); returns the open file descriptor holding it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunFolderInUse(
            f"run folder {run_dir} is in use by {_holder(path)} (lock {path}): wait for that training to end, "
            "stop it, or train into another run folder"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return fd


@contextlib.contextmanager
def run_folder_lock(run_dir: str | os.PathLike, state: Any = None) -> Iterator[None]:
    """Hold the lock of ``run_dir`` in the ``with`` block; raise :class:`RunFolderInUse` if another process has it.

    state: an ``accelerate`` ``PartialState`` / ``Accelerator`` of a multi-process launch (None: one process);
    its main process takes the lock and every process raises when that fails.
    """
    run_dir = Path(run_dir)
    main = state is None or state.is_main_process
    fd, error, created = None, None, not run_dir.exists()
    if main:
        try:
            fd = _acquire(run_dir)
        except RunFolderInUse as e:
            error = str(e)
    if state is not None and state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        error = broadcast_object_list([error])[0]
    if error is not None:
        raise RunFolderInUse(error)
    try:
        yield
    finally:
        if fd is not None:
            if created and os.listdir(run_dir) == [LOCK_FILE]:  # a run that failed at start leaves no folder behind
                (run_dir / LOCK_FILE).unlink()
                run_dir.rmdir()
            os.close(fd)  # closing the only descriptor releases the flock
