"""The one place that knows the key layout (Oxia keys and object keys)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.errors import InvalidRequest
from app.storage.names import NAME_RULE, is_name

MAX_PARTITION = 2**31 - 1
OFFSET_DIGITS = 20
_MEMBER_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_DIGITS = re.compile(r"[0-9]+")
# Every consumer group's record lives on one shard (one range scan lists them); each
# group's leases and committed offsets on the shard of its own partition key.
GROUPS_PARTITION_KEY = "_groups"
# Every broker's membership record lives on one shard too (one range scan lists them).
# A topic named "_brokers" cannot clash: its keys lie deeper ({root}/_brokers/partitions/
# …) and its partition keys are "_brokers:{p}".
MEMBERS_PARTITION_KEY = "_brokers"
# Forward fences (app/cluster/fences.py) live on one shard too, so that one range delete
# sweeps the old ones; a topic named "_fences" cannot clash, as with "_brokers".
FENCES_PARTITION_KEY = "_fences"
_FENCE_TOKEN = re.compile(r"[A-Za-z0-9._-]{1,200}")


def is_fence_token(token: str) -> bool:
    """Whether ``token`` may name a forward fence (app/cluster/fences.py)."""
    return _FENCE_TOKEN.fullmatch(token) is not None


def validate_topic(topic: object) -> str:
    """Kafka's rule (app/storage/names.py)."""
    if not is_name(topic):
        raise InvalidRequest(f"invalid topic {topic!r}: {NAME_RULE}")
    return topic


def validate_group(group: object) -> str:
    """Consumer group names follow the topic rule, so they are safe in a key."""
    if not is_name(group):
        raise InvalidRequest(f"invalid group {group!r}: {NAME_RULE}")
    return group


def validate_member_id(member_id: object) -> str:
    if not isinstance(member_id, str) or not _MEMBER_ID.fullmatch(member_id):
        raise InvalidRequest(f"invalid member_id {member_id!r}: 1..64 characters of "
                             "[A-Za-z0-9._-]")
    return member_id


def group_partition_key(group: str) -> str:
    """Oxia routing key of a group's leases and offsets ('/' is in no topic's key)."""
    return f"{GROUPS_PARTITION_KEY}/{validate_group(group)}"


def validate_partition(partition: object) -> int:
    if (
        not isinstance(partition, int)
        or isinstance(partition, bool)
        or not 0 <= partition <= MAX_PARTITION
    ):
        raise InvalidRequest(f"invalid partition {partition!r}: an integer in 0..{MAX_PARTITION}")
    return partition


@dataclass(frozen=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    def __post_init__(self) -> None:
        validate_topic(self.topic)
        validate_partition(self.partition)

    @property
    def partition_key(self) -> str:
        """Oxia routing key: every key of one topic-partition lives on one shard."""
        return f"{self.topic}:{self.partition}"

    def __str__(self) -> str:
        return self.partition_key


def format_offset(offset: int) -> str:
    return f"{offset:0{OFFSET_DIGITS}d}"


@dataclass(frozen=True)
class KeyLayout:
    """Oxia keys under ``{root}/{topic}/partitions/{partition}/`` and S3 object keys."""

    root: str
    bucket: str

    def partition_prefix(self, tp: TopicPartition) -> str:
        return f"{self.root}/{tp.topic}/partitions/{tp.partition}/"

    def control(self, tp: TopicPartition) -> str:
        return self.partition_prefix(tp) + "meta/control"

    def compaction_cursor(self, tp: TopicPartition) -> str:
        return self.partition_prefix(tp) + "meta/compaction-cursor"

    def compaction(self, tp: TopicPartition) -> str:
        return self.partition_prefix(tp) + "meta/compaction"

    def compactor_claim(self, tp: TopicPartition) -> str:
        return self.partition_prefix(tp) + "meta/compactor-claim"

    def topic_record(self, topic: str) -> str:
        """``{root}/_topics/{topic}``: the topic catalog (two segments deep)."""
        return f"{self.root}/_topics/{topic}"

    def groups_prefix(self) -> str:
        """``{root}/_groups/``: the group records are the keys one segment below it."""
        return f"{self.root}/_groups/"

    def group_record(self, group: str) -> str:
        """``{root}/_groups/{group}``: membership and generation (two segments deep)."""
        return self.groups_prefix() + validate_group(group)

    def group_members_prefix(self, group: str) -> str:
        return self.group_record(group) + "/members/"

    def group_lease(self, group: str, member_id: str) -> str:
        return self.group_members_prefix(group) + validate_member_id(member_id)

    def group_offsets_prefix(self, group: str) -> str:
        return self.group_record(group) + "/offsets/"

    def group_offset(self, group: str, tp: TopicPartition) -> str:
        return self.group_offsets_prefix(group) + f"{tp.topic}/{tp.partition:010d}"

    def parse_group_offset(self, group: str, key: str) -> TopicPartition | None:
        """The topic-partition of one of ``group``'s committed-offset keys, else None."""
        prefix = self.group_offsets_prefix(group)
        if not key.startswith(prefix):
            return None
        topic, sep, digits = key[len(prefix):].partition("/")
        if not sep or len(digits) != 10 or not _DIGITS.fullmatch(digits):
            return None
        try:
            return TopicPartition(topic, int(digits))
        except InvalidRequest:
            return None

    def members_prefix(self) -> str:
        """``{root}/_brokers/``: the member records are the keys one segment below it."""
        return f"{self.root}/_brokers/"

    def member(self, member_id: str) -> str:
        """``{root}/_brokers/{member_id}``: a broker worker's ephemeral record (a hint for
        routing appends, never read by recovery)."""
        return self.members_prefix() + validate_member_id(member_id)

    def parse_member_key(self, key: str) -> str | None:
        """The member id of a key one segment below :meth:`members_prefix`, else None
        (the keys of a topic named ``_brokers`` lie deeper)."""
        prefix = self.members_prefix()
        if not key.startswith(prefix):
            return None
        member_id = key[len(prefix):]
        return member_id if _MEMBER_ID.fullmatch(member_id) else None

    def fences_prefix(self) -> str:
        """``{root}/_fences/``: the forward fences are the keys one segment below it."""
        return f"{self.root}/_fences/"

    def forward_fence(self, minute: int, token: str) -> str:
        """``{root}/_fences/{minute}.{token}``: the fence of one forwarded frame, named
        by the forwarder's minute (wall clock) and its token, so that fences sort by
        age and :meth:`fences_before` bounds a sweep."""
        if not is_fence_token(token):
            raise InvalidRequest(f"invalid forward fence token {token!r}: 1..200 "
                                 "characters of [A-Za-z0-9._-]")
        return f"{self.fences_prefix()}{minute:012d}.{token}"

    def fences_before(self, minute: int) -> str:
        """The first fence key of ``minute``: every older fence sorts below it."""
        return f"{self.fences_prefix()}{minute:012d}"

    def store_identity(self) -> str:
        """``{root}/_meta/store-id``: two segments deep, so no topic's key can be it."""
        return f"{self.root}/_meta/store-id"

    def index_prefix(self, tp: TopicPartition) -> str:
        return self.partition_prefix(tp) + "index/"

    def index(self, tp: TopicPartition, end_offset: int) -> str:
        return self.index_prefix(tp) + format_offset(end_offset)

    def index_scan_end(self, tp: TopicPartition) -> str:
        """Exclusive upper bound of the partition's ``index/`` keys ('~' > any digit)."""
        return self.index_prefix(tp) + "~"

    def index_end_offset(self, tp: TopicPartition, key: str) -> int | None:
        """The end offset encoded in ``key``, or None if ``key`` is not this partition's."""
        prefix = self.index_prefix(tp)
        if not key.startswith(prefix):
            return None
        digits = key[len(prefix):]
        if len(digits) != OFFSET_DIGITS or not _DIGITS.fullmatch(digits):
            return None
        return int(digits)

    # -- objects ---------------------------------------------------------------------

    def shared_wal_object(self, blob_id: str) -> str:
        return f"{self.root}/wal-shared/{blob_id}"

    def legacy_wal_object(self, tp: TopicPartition, blob_id: str) -> str:
        return self.partition_prefix(tp) + f"data/wal/{blob_id}"

    def compacted_object(self, tp: TopicPartition, blob_id: str) -> str:
        return self.partition_prefix(tp) + f"data/compacted/{blob_id}"

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    @staticmethod
    def parse_uri(uri: str) -> tuple[str, str]:
        if not uri.startswith("s3://"):
            raise InvalidRequest(f"not an s3:// URI: {uri!r}")
        bucket, _, key = uri[5:].partition("/")
        if not bucket or not key:
            raise InvalidRequest(f"not an s3://bucket/key URI: {uri!r}")
        return bucket, key

    def parse_control_key(self, key: str) -> TopicPartition | None:
        """``{root}/{topic}/partitions/{p}/meta/control`` -> TopicPartition (discovery)."""
        if not key.endswith("/meta/control"):
            return None
        return self.parse_partition_key(key)

    def parse_partition_key(self, key: str) -> TopicPartition | None:
        """The topic-partition of any ``{root}/{topic}/partitions/{p}/(meta|index)/{name}``
        key, or None for any other key."""
        prefix = self.root + "/"
        if not key.startswith(prefix):
            return None
        rest, _, name = key.rpartition("/")
        middle, _, area = rest.rpartition("/")
        if area not in ("meta", "index") or not name:
            return None
        topic, sep, partition = middle[len(prefix):].rpartition("/partitions/")
        # Only the canonical spelling: ASCII digits, no leading zeros.
        if not sep or not _DIGITS.fullmatch(partition) or str(int(partition)) != partition:
            return None
        try:
            return TopicPartition(topic, int(partition))
        except InvalidRequest:
            return None
