"""Pure unit tests of topic/partition validation and the key layout (app/storage/keys.py)."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import InvalidRequest
from app.storage.keys import (
    MAX_PARTITION,
    MEMBERS_PARTITION_KEY,
    KeyLayout,
    TopicPartition,
    format_offset,
    group_partition_key,
    validate_group,
    validate_member_id,
    validate_partition,
    validate_topic,
)

PROPS = settings(max_examples=200, deadline=None)
TOPIC_ALPHABET = string.ascii_letters + string.digits + "._-"
topics_st = st.text(TOPIC_ALPHABET, min_size=1, max_size=249).filter(lambda t: t not in (".", ".."))
partitions_st = st.integers(min_value=0, max_value=MAX_PARTITION)
offsets_st = st.integers(min_value=0, max_value=10**20 - 1)

LAYOUT = KeyLayout(root="llog", bucket="leaderless-log-wal")
ORDERS0 = TopicPartition("orders", 0)


# -- topics -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic",
    ["a", "orders", "Orders.v2", "a-b_c.d", "...", ".a", "a.", "..a", "0", "_", "-", "x" * 249],
)
def test_valid_topics(topic: str) -> None:
    assert validate_topic(topic) == topic
    assert TopicPartition(topic, 0).topic == topic


@pytest.mark.parametrize(
    "topic",
    [
        "",
        ".",
        "..",
        "x" * 250,
        "a/b",
        "/",
        "a b",
        " ",
        "a\tb",
        "é",
        "ordérs",
        "topic\u200b",
        "a:b",
        "a*",
        "a\\b",
        "\x00",
        None,
        0,
        b"orders",
        ["orders"],
    ],
)
def test_invalid_topics(topic: object) -> None:
    with pytest.raises(InvalidRequest):
        validate_topic(topic)
    with pytest.raises(InvalidRequest):
        TopicPartition(topic, 0)  # type: ignore[arg-type]


def test_invalid_input_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        validate_topic("")


@PROPS
@given(topics_st)
def test_generated_valid_topics(topic: str) -> None:
    assert validate_topic(topic) == topic


@PROPS
@given(st.text(min_size=1, max_size=20).filter(lambda t: any(c not in TOPIC_ALPHABET for c in t)))
def test_topics_with_any_foreign_character_are_rejected(topic: str) -> None:
    with pytest.raises(InvalidRequest):
        validate_topic(topic)


@pytest.mark.parametrize("topic", ["orders\n", "a\n"])
def test_topic_with_trailing_newline_is_rejected(topic: str) -> None:
    with pytest.raises(InvalidRequest):
        validate_topic(topic)


# -- partitions -------------------------------------------------------------------------


@pytest.mark.parametrize("partition", [0, 1, 10, MAX_PARTITION])
def test_valid_partitions(partition: int) -> None:
    assert MAX_PARTITION == 2**31 - 1
    assert validate_partition(partition) == partition


@pytest.mark.parametrize(
    "partition", [-1, -(2**31), 2**31, 2**63, True, False, "0", "1", 0.0, 1.5, None, [0]]
)
def test_invalid_partitions(partition: object) -> None:
    with pytest.raises(InvalidRequest):
        validate_partition(partition)
    with pytest.raises(InvalidRequest):
        TopicPartition("orders", partition)  # type: ignore[arg-type]


# -- TopicPartition ---------------------------------------------------------------------


@PROPS
@given(topics_st, partitions_st)
def test_partition_key(topic: str, partition: int) -> None:
    tp = TopicPartition(topic, partition)
    assert tp.partition_key == f"{topic}:{partition}"
    assert str(tp) == tp.partition_key


def test_topic_partition_is_frozen_hashable_and_ordered() -> None:
    assert TopicPartition("orders", 0).partition_key == "orders:0"
    assert TopicPartition("a", 1) == TopicPartition("a", 1)
    assert len({TopicPartition("a", 1), TopicPartition("a", 1)}) == 1
    assert sorted([TopicPartition("b", 0), TopicPartition("a", 2), TopicPartition("a", 1)]) == [
        TopicPartition("a", 1),
        TopicPartition("a", 2),
        TopicPartition("b", 0),
    ]
    with pytest.raises(AttributeError):
        ORDERS0.topic = "x"  # type: ignore[misc]


# -- Oxia keys --------------------------------------------------------------------------


def test_format_offset() -> None:
    assert format_offset(2) == "00000000000000000002"
    assert format_offset(0) == "0" * 20
    assert format_offset(10**20 - 1) == "9" * 20


def test_oxia_keys_match_protocol() -> None:
    assert LAYOUT.partition_prefix(ORDERS0) == "llog/orders/partitions/0/"
    assert LAYOUT.control(ORDERS0) == "llog/orders/partitions/0/meta/control"
    assert LAYOUT.compaction_cursor(ORDERS0) == "llog/orders/partitions/0/meta/compaction-cursor"
    assert LAYOUT.compaction(ORDERS0) == "llog/orders/partitions/0/meta/compaction"
    assert LAYOUT.compactor_claim(ORDERS0) == "llog/orders/partitions/0/meta/compactor-claim"
    assert LAYOUT.index_prefix(ORDERS0) == "llog/orders/partitions/0/index/"
    assert LAYOUT.index(ORDERS0, 2) == "llog/orders/partitions/0/index/00000000000000000002"
    assert LAYOUT.index_scan_end(ORDERS0) == "llog/orders/partitions/0/index/~"


def test_member_keys_match_protocol_and_no_topic_named_brokers_clashes() -> None:
    assert LAYOUT.members_prefix() == "llog/_brokers/"
    assert LAYOUT.member("b1.w0") == "llog/_brokers/b1.w0"
    assert LAYOUT.parse_member_key("llog/_brokers/b1.w0") == "b1.w0"
    with pytest.raises(InvalidRequest):
        LAYOUT.member("b1/w0")
    # A topic named _brokers: its keys lie deeper, its partition key differs.
    brokers = TopicPartition("_brokers", 0)
    for key in (LAYOUT.control(brokers), LAYOUT.index(brokers, 1),
                LAYOUT.compactor_claim(brokers), LAYOUT.partition_prefix(brokers)):
        assert key.startswith(LAYOUT.members_prefix())
        assert LAYOUT.parse_member_key(key) is None
    assert brokers.partition_key != MEMBERS_PARTITION_KEY
    assert LAYOUT.parse_member_key("llog/_groups/b1.w0") is None
    assert LAYOUT.parse_member_key("llog/_brokers/") is None


def test_object_keys_match_protocol() -> None:
    tp = TopicPartition("clicks", 7)
    blob_id = "0b6f1a9e-1111-4222-8333-444455556666"
    assert LAYOUT.shared_wal_object(blob_id) == f"llog/wal-shared/{blob_id}"
    assert LAYOUT.compacted_object(tp, blob_id) == (
        f"llog/clicks/partitions/7/data/compacted/{blob_id}"
    )
    assert LAYOUT.legacy_wal_object(tp, blob_id) == f"llog/clicks/partitions/7/data/wal/{blob_id}"
    assert LAYOUT.uri(LAYOUT.shared_wal_object(blob_id)) == (
        f"s3://leaderless-log-wal/llog/wal-shared/{blob_id}"
    )


def test_custom_root() -> None:
    layout = KeyLayout(root="env/prod", bucket="b")
    assert layout.control(ORDERS0) == "env/prod/orders/partitions/0/meta/control"
    assert layout.shared_wal_object("x") == "env/prod/wal-shared/x"


@PROPS
@given(topics_st, partitions_st, offsets_st, offsets_st)
def test_index_keys_sort_like_offsets(topic: str, partition: int, a: int, b: int) -> None:
    tp = TopicPartition(topic, partition)
    ka, kb = LAYOUT.index(tp, a), LAYOUT.index(tp, b)
    assert (ka < kb) == (a < b)
    assert ka < LAYOUT.index_scan_end(tp)
    assert ka.startswith(LAYOUT.index_prefix(tp))


@PROPS
@given(topics_st, partitions_st, offsets_st)
def test_index_end_offset_round_trip(topic: str, partition: int, offset: int) -> None:
    tp = TopicPartition(topic, partition)
    assert LAYOUT.index_end_offset(tp, LAYOUT.index(tp, offset)) == offset


@pytest.mark.parametrize(
    ("tp", "other"),
    [
        (TopicPartition("a", 1), TopicPartition("a", 10)),
        (TopicPartition("a", 10), TopicPartition("a", 1)),
        (TopicPartition("a", 1), TopicPartition("a", 11)),
        (TopicPartition("a", 0), TopicPartition("a.b", 0)),
        (TopicPartition("a.b", 0), TopicPartition("a", 0)),
        (TopicPartition("a", 0), TopicPartition("ab", 0)),
        (TopicPartition("a", 0), TopicPartition("b", 0)),
    ],
)
def test_index_end_offset_rejects_other_partitions(
    tp: TopicPartition, other: TopicPartition
) -> None:
    assert LAYOUT.index_end_offset(tp, LAYOUT.index(other, 5)) is None


@pytest.mark.parametrize(
    "suffix",
    [
        "",
        "5",
        "0" * 19,
        "0" * 21,
        "0000000000000000000x",
        "-0000000000000000001",
        "+0000000000000000001",
        " 0000000000000000001",
        "~",
        "00000000000000000002/extra",
    ],
)
def test_index_end_offset_rejects_malformed_suffixes(suffix: str) -> None:
    assert LAYOUT.index_end_offset(ORDERS0, LAYOUT.index_prefix(ORDERS0) + suffix) is None


def test_index_end_offset_rejects_non_index_keys() -> None:
    assert LAYOUT.index_end_offset(ORDERS0, LAYOUT.control(ORDERS0)) is None
    assert LAYOUT.index_end_offset(ORDERS0, "other/orders/partitions/0/index/" + "0" * 20) is None


@pytest.mark.parametrize("digit", ["\u0663", "\u00b2", "\uff11"])
def test_index_end_offset_rejects_non_ascii_digits(digit: str) -> None:
    assert LAYOUT.index_end_offset(ORDERS0, LAYOUT.index_prefix(ORDERS0) + digit * 20) is None


# -- URIs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://b/k", ("b", "k")),
        ("s3://leaderless-log-wal/llog/wal-shared/x", ("leaderless-log-wal", "llog/wal-shared/x")),
        ("s3://b/a/b/c/", ("b", "a/b/c/")),
    ],
)
def test_parse_uri(uri: str, expected: tuple[str, str]) -> None:
    assert KeyLayout.parse_uri(uri) == expected
    assert LAYOUT.parse_uri(uri) == expected


@pytest.mark.parametrize(
    "uri", ["", "s3://", "s3://b", "s3://b/", "s3:///k", "http://b/k", "S3://b/k", "b/k", "s3:/b/k"]
)
def test_parse_uri_rejects(uri: str) -> None:
    with pytest.raises(InvalidRequest):
        KeyLayout.parse_uri(uri)


@PROPS
@given(topics_st, partitions_st, st.uuids())
def test_uri_round_trip(topic: str, partition: int, blob_id: object) -> None:
    tp = TopicPartition(topic, partition)
    for key in (
        LAYOUT.shared_wal_object(str(blob_id)),
        LAYOUT.compacted_object(tp, str(blob_id)),
        LAYOUT.legacy_wal_object(tp, str(blob_id)),
    ):
        assert KeyLayout.parse_uri(LAYOUT.uri(key)) == (LAYOUT.bucket, key)


# -- control-key discovery --------------------------------------------------------------


@PROPS
@given(st.sampled_from(["llog", "a", "env/prod", "x.y-z"]), topics_st, partitions_st)
def test_parse_control_key_round_trip(root: str, topic: str, partition: int) -> None:
    layout = KeyLayout(root=root, bucket="b")
    tp = TopicPartition(topic, partition)
    assert layout.parse_control_key(layout.control(tp)) == tp


def test_parse_control_key_topic_named_partitions() -> None:
    tp = TopicPartition("partitions", 3)
    assert LAYOUT.parse_control_key(LAYOUT.control(tp)) == tp


@pytest.mark.parametrize(
    "key",
    [
        "",
        "llog",
        "llog/",
        "llog/orders/partitions/0/meta/compaction",
        "llog/orders/partitions/0/meta/compaction-cursor",
        "llog/orders/partitions/0/meta/control/x",
        "llog/orders/partitions/0/index/00000000000000000001",
        "llog/orders/partitions//meta/control",
        "llog/orders/partitions/-1/meta/control",
        "llog/orders/partitions/+1/meta/control",
        "llog/orders/partitions/1.0/meta/control",
        "llog/orders/partitions/x/meta/control",
        "llog/orders/partitions/2147483648/meta/control",
        "llog/orders/partition/0/meta/control",
        "llog/orders/0/meta/control",
        "llog/partitions/0/meta/control",
        "llog//partitions/0/meta/control",
        "llog/./partitions/0/meta/control",
        "llog/../partitions/0/meta/control",
        "llog/a b/partitions/0/meta/control",
        "llog/a/b/partitions/0/meta/control",
        "llog/a/partitions/0/partitions/1/meta/control",
        "other/orders/partitions/0/meta/control",
        "llogx/orders/partitions/0/meta/control",
        "/llog/orders/partitions/0/meta/control",
        "llog/wal-shared/abc",
    ],
)
def test_parse_control_key_rejects(key: str) -> None:
    assert LAYOUT.parse_control_key(key) is None


@pytest.mark.parametrize("partition", ["\u00b2", "\u0663", "007", "00"])
def test_parse_control_key_rejects_non_canonical_partitions(partition: str) -> None:
    key = f"llog/orders/partitions/{partition}/meta/control"
    tp = LAYOUT.parse_control_key(key)
    # Only a key this layout would itself produce may be discovered.
    assert tp is None or LAYOUT.control(tp) == key


def test_group_keys_match_protocol() -> None:
    assert LAYOUT.group_record("billing") == "llog/_groups/billing"
    assert LAYOUT.group_lease("billing", "m1") == "llog/_groups/billing/members/m1"
    assert (LAYOUT.group_offset("billing", ORDERS0)
            == "llog/_groups/billing/offsets/orders/0000000000")
    assert group_partition_key("billing") == "_groups/billing"
    for bad in ("", ".", "..", "a/b", "a:b", "x" * 250, 7):
        with pytest.raises(InvalidRequest):
            validate_group(bad)
    for bad in ("", "a/b", "x" * 65, None):
        with pytest.raises(InvalidRequest):
            validate_member_id(bad)


@PROPS
@given(st.sampled_from(["partitions", "meta", "index", "0", "_groups"]) | topics_st,
       st.sampled_from(["meta", "index", "partitions", "0"]) | topics_st, partitions_st,
       st.sampled_from(["meta", "index", "0", "control"]) | st.text(TOPIC_ALPHABET, min_size=1,
                                                                    max_size=64))
def test_group_keys_are_never_partition_keys(group: str, topic: str, partition: int,
                                             member: str) -> None:
    """Discovery lists every key below the root and keeps those that parse as a
    partition's: a group's never do, whatever its, its topics' and members' names."""
    tp = TopicPartition(topic, partition)
    for key in (LAYOUT.group_record(group), LAYOUT.group_lease(group, member),
                LAYOUT.group_offset(group, tp)):
        assert LAYOUT.parse_partition_key(key) is None
    assert LAYOUT.parse_group_offset(group, LAYOUT.group_offset(group, tp)) == tp
    assert LAYOUT.parse_group_offset(group, LAYOUT.group_lease(group, member)) is None
