"""The broker's change notifications from the real Oxia: the streams read by hand
(app/stores/oxia/notification_wire.py) say what the client's own decoder would, and a
listener that wants some keys gets those alone, in order."""

from __future__ import annotations

import queue
import threading
import uuid

import pytest
from oxia.defs import NotificationType

from app.localstack.stack import LocalStack
from app.stores.oxia import notification_wire
from app.stores.oxia import notifications as oxia_notifications
from app.stores.oxia import patches as oxia_patches

NOTIFIED_S = 60.0


def test_a_listener_gets_the_keys_it_wants_with_their_types_and_versions(
        stack: LocalStack) -> None:
    client = oxia_patches.connect(stack.oxia_address, request_timeout_s=5)
    prefix = f"notes-{uuid.uuid4().hex}"
    notes = oxia_notifications.notifications(
        client, wanted=lambda key: key.startswith(f"{prefix}/want"))
    seen: queue.Queue[tuple[str, NotificationType, int, str | None]] = queue.Queue()
    threading.Thread(target=lambda: [
        seen.put((n.key(), n.notification_type(), n.version_id(), n.key_range_end()))
        for n in notes], daemon=True).start()
    want, other = f"{prefix}/want/a", f"{prefix}/other"
    shard = {"partition_key": prefix}  # one shard: its changes come in order
    try:
        client.put(other, b"x", **shard)
        _, created = client.put(want, b"1", **shard)
        client.put(other, b"y", **shard)
        _, modified = client.put(want, b"2", **shard)
        client.delete(want, **shard)
        client.put(f"{prefix}/want/b", b"3", **shard)
        client.delete_range(f"{prefix}/want/", f"{prefix}/want/~", **shard)
        got = [seen.get(timeout=NOTIFIED_S) for _ in range(5)]
    finally:
        notes.close()
        client.close()
    assert got[:3] == [
        (want, NotificationType.KEY_CREATED, created.version_id(), None),
        (want, NotificationType.KEY_MODIFIED, modified.version_id(), None),
        (want, NotificationType.KEY_DELETED, 0, None)]
    assert got[3][:2] == (f"{prefix}/want/b", NotificationType.KEY_CREATED)
    assert got[4] == (f"{prefix}/want/", NotificationType.KEY_RANGE_DELETED, 0,
                      f"{prefix}/want/~")
    assert seen.empty()  # nothing of the other key


@pytest.mark.parametrize("fault", ["does not decode", "unknown type"])
def test_a_batch_that_cannot_be_read_is_skipped_and_the_stream_goes_on(
        stack: LocalStack, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """A batch holding a marker key is refused (bytes that do not decode, or a change
    of a type this client does not know): it is skipped once, reported as a resumption
    (what it held is unknown), and the changes after it arrive; the stream is not
    reopened over and over on the same batch."""
    def refusing(raw: bytes) -> notification_wire.Batch | notification_wire.Refused:
        batch = notification_wire.read_batch(raw)
        if b"MARKER" not in raw or isinstance(batch, notification_wire.Refused):
            return batch
        if fault == "does not decode":
            return notification_wire.Refused(batch.shard, batch.offset, "test: refused")
        return batch._replace(changes=[c._replace(type=99) for c in batch.changes])

    monkeypatch.setattr(oxia_notifications, "read_batch", refusing)
    client = oxia_patches.connect(stack.oxia_address, request_timeout_s=5)
    prefix = f"notes-{uuid.uuid4().hex}"
    resumed = threading.Semaphore(0)
    notes = oxia_notifications.notifications(
        client, wanted=lambda key: key.startswith(prefix), on_resumed=resumed.release)
    seen: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [seen.put(n.key()) for n in notes], daemon=True).start()
    shard = {"partition_key": prefix}
    try:
        client.put(f"{prefix}/before", b"1", **shard)
        assert seen.get(timeout=NOTIFIED_S) == f"{prefix}/before"
        client.put(f"{prefix}/MARKER", b"x", **shard)
        client.put(f"{prefix}/after", b"2", **shard)
        assert seen.get(timeout=NOTIFIED_S) == f"{prefix}/after"
        assert resumed.acquire(timeout=NOTIFIED_S)
    finally:
        notes.close()
        client.close()
    assert notes.resumptions == 1  # the skip alone: no stream was reopened
