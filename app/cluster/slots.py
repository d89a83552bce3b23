"""Worker slots: a stable number for each worker of one ``llog serve --workers N``.

The workers of one server share one listening socket, so the kernel picks which worker
takes a request, and each worker is a member of its own (its own Oxia session, its own
record). A worker's member id is ``{broker_id}.w{slot}``: at start it takes the lowest
slot whose lock file ``{dir}/slots/{i}.lock`` it can ``flock``, in the server's shared
metrics directory, and holds it for its life. The kernel releases the lock when the
process dies, however it dies, so the worker uvicorn starts in its place takes the same
slot, the same id and so exactly its predecessor's partitions.

A process without a shared directory (one worker, or an app in a test) is slot 0.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

MAX_SLOTS = 64


class NoFreeSlot(RuntimeError):
    """Every slot of the directory is held by a live worker."""


@dataclass
class Slot:
    index: int
    path: Path | None = None  # the lock file held, None without a shared directory
    _fd: int | None = None

    def release(self) -> None:
        """Let the slot go (the kernel does it anyway when the process ends)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file drops its flock


def take_slot(shared_dir: Path | None) -> Slot:
    """The lowest free slot of ``shared_dir`` (held until released or the process ends);
    slot 0, unlocked, when there is no shared directory. Blocking file calls: run it
    off the event loop."""
    if shared_dir is None:
        return Slot(0)
    slots = shared_dir / "slots"
    slots.mkdir(parents=True, exist_ok=True)
    for index in range(MAX_SLOTS):
        path = slots / f"{index}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            # flock, not lockf: flock locks belong to the open file, so two takes in one
            # process exclude each other too.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        with contextlib.suppress(OSError):  # for an operator looking at the directory
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        return Slot(index, path, fd)
    raise NoFreeSlot(f"all {MAX_SLOTS} worker slots of {slots} are held")


def member_id(broker_id: str, slot: int) -> str:
    return f"{broker_id}.w{slot}"
