"""The broker's change notifications from the real Oxia: the streams read by hand
(app/storage/notification_wire.py) say what the client's own decoder would, and a
listener that wants some keys gets those alone, in order."""

from __future__ import annotations

import queue
import threading
import uuid

from oxia.defs import NotificationType

from app.localstack.stack import LocalStack
from app.storage import oxia_compat, oxia_notifications

NOTIFIED_S = 60.0


def test_a_listener_gets_the_keys_it_wants_with_their_types_and_versions(
        stack: LocalStack) -> None:
    client = oxia_compat.connect(stack.oxia_address, request_timeout_s=5)
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
