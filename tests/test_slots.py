"""Worker slots: the lowest free one, held for the holder's life, taken again once free."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.cluster.slots import MAX_SLOTS, NoFreeSlot, member_id, take_slot


def test_slots_are_taken_lowest_first_and_again_once_released(tmp_path: Path) -> None:
    first, second = take_slot(tmp_path), take_slot(tmp_path)
    assert (first.index, second.index) == (0, 1)
    first.release()
    first.release()  # idempotent
    again = take_slot(tmp_path)
    assert again.index == 0
    third = take_slot(tmp_path)
    assert third.index == 2
    assert member_id("b1", again.index) == "b1.w0"
    for slot in (second, again, third):
        slot.release()


def test_without_a_shared_directory_a_process_is_slot_zero() -> None:
    assert take_slot(None).index == 0
    assert take_slot(None).index == 0


def test_a_dead_holder_frees_its_slot(tmp_path: Path) -> None:
    """The kernel drops the lock of a process that ends without letting go."""
    code = ("import os, sys\nfrom pathlib import Path\nfrom app.cluster.slots import "
            "take_slot\nslot = take_slot(Path(sys.argv[1]))\nprint(slot.index, flush=True)\n"
            "os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True,
                         capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "0"
    slot = take_slot(tmp_path)
    assert slot.index == 0
    slot.release()


def test_a_full_directory_is_refused(tmp_path: Path) -> None:
    held = [take_slot(tmp_path) for _ in range(MAX_SLOTS)]
    assert [s.index for s in held] == list(range(MAX_SLOTS))
    try:
        with pytest.raises(NoFreeSlot):
            take_slot(tmp_path)
    finally:
        for slot in held:
            slot.release()
