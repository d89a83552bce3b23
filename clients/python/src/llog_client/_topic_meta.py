"""What the producer knows of a topic: how many partitions it has (to place keyed
records as the broker would, and to spread the others) and how it stores records
(``compression``: the producer compresses requests for topics stored compressed, unless
told otherwise). Read from ``GET /topics/{topic}`` and read again after ``MAX_AGE_S``:
partitions only grow, and keyed records follow a grown count as Kafka's do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from llog_client._accumulator import Batch

from llog_client import _wire as wire
from llog_client._errors import UnknownTopic

MAX_AGE_S = 60.0
# An unknown topic is asked about again this soon: produce creates it on first use.
UNKNOWN_AGE_S = 1.0


@dataclass
class TopicMeta:
    """``partitions`` None: the topic does not exist (yet)."""

    partitions: int | None
    compression: str
    expires: float
    sticky: int = 0  # the partition records without key or partition go to now
    sticky_batch: Batch | None = None  # the batch they fill there
    sticky_route: tuple[str, int, None] | None = None  # made once per sticky partition

    UNKNOWN: ClassVar[TopicMeta]

    @classmethod
    def parse(cls, reply: wire.Reply, now: float) -> TopicMeta:
        """The topic of a ``GET /topics/{topic}`` answer; raises the answer's error
        unless it is UnknownTopic."""
        body = reply.body
        if reply.status == 200 and isinstance(body, dict) and isinstance(
                body.get("partitions"), int) and body["partitions"] > 0:
            return cls(int(body["partitions"]), str(body.get("compression") or "none"),
                       now + MAX_AGE_S)
        error = wire.reply_error(reply)
        if isinstance(error, UnknownTopic):
            return cls(None, "none", now + UNKNOWN_AGE_S)
        raise error


TopicMeta.UNKNOWN = TopicMeta(None, "none", 0.0)
