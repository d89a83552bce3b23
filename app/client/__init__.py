"""The Python client of leaderless-log: it speaks the broker's HTTP API
(docs/http-api.md) and nothing else, so it runs wherever httpx does.

    from app.client import LlogClient, Record

    with LlogClient("http://127.0.0.1:8080") as llog:
        llog.produce("orders", ["alpha", Record("created", key="customer-17")])
        for record in llog.iter_records("orders", 0, start="earliest", follow=False):
            print(record.offset, record.value)

See docs/client.md.
"""

from app.client.aio import AsyncLlogClient
from app.client.config import DEFAULT_BROKER_URL, version
from app.client.errors import (
    AccessError,
    AppendError,
    BackPressureRejected,
    ClientError,
    CommitConflict,
    CommitExpired,
    CommitInDoubt,
    CorruptData,
    Forbidden,
    HTTPError,
    InvalidRequest,
    LlogError,
    LogGap,
    MethodNotAllowed,
    NotFound,
    ObjectMissing,
    OffsetOutOfRange,
    PartitionFenced,
    PayloadTooLarge,
    QuotaExceeded,
    RequestError,
    RoleDisabled,
    ShuttingDown,
    StorageError,
    StorageUnavailable,
    TopicExists,
    TransportError,
    Unauthenticated,
    Unavailable,
    UnexpectedResponse,
    UnknownPartition,
    UnknownTopic,
)
from app.client.models import (
    ConsumedRecord,
    Fetched,
    PartitionOffsets,
    PartitionState,
    ProducedBatch,
    ProduceResult,
    Record,
    TopicDescription,
    TopicInfo,
)
from app.client.params import UNSET
from app.client.retry import NO_RETRIES, ProduceLimits, RetryPolicy
from app.client.sync import LlogClient

__all__ = [
    "DEFAULT_BROKER_URL",
    "NO_RETRIES",
    "UNSET",
    "AccessError",
    "AppendError",
    "AsyncLlogClient",
    "BackPressureRejected",
    "ClientError",
    "CommitConflict",
    "CommitExpired",
    "CommitInDoubt",
    "ConsumedRecord",
    "CorruptData",
    "Fetched",
    "Forbidden",
    "HTTPError",
    "InvalidRequest",
    "LlogClient",
    "LlogError",
    "LogGap",
    "MethodNotAllowed",
    "NotFound",
    "ObjectMissing",
    "OffsetOutOfRange",
    "PartitionFenced",
    "PartitionOffsets",
    "PartitionState",
    "PayloadTooLarge",
    "ProduceLimits",
    "ProduceResult",
    "ProducedBatch",
    "QuotaExceeded",
    "Record",
    "RequestError",
    "RetryPolicy",
    "RoleDisabled",
    "ShuttingDown",
    "StorageError",
    "StorageUnavailable",
    "TopicDescription",
    "TopicExists",
    "TopicInfo",
    "TransportError",
    "Unauthenticated",
    "Unavailable",
    "UnexpectedResponse",
    "UnknownPartition",
    "UnknownTopic",
    "version",
]
