"""Which servers the test stack runs: single servers by default, or clusters.

``LLOG_TEST_OXIA_CLUSTER=3`` runs the session stack's Oxia as its coordinator and three
data servers (replication factor 3, four shards); ``LLOG_TEST_S3_DRIVES=4`` runs MinIO
erasure coded over four drives. The failure tests start clusters of their own whatever
these say.
"""

from __future__ import annotations

import os
from typing import Any

from app.localstack.oxia_cluster import OxiaClusterConfig

OXIA_ENV = "LLOG_TEST_OXIA_CLUSTER"
DRIVES_ENV = "LLOG_TEST_S3_DRIVES"


def stack_overrides(env: dict[str, str] | None = None) -> dict[str, Any]:
    """StackConfig fields for the session stack, from the environment."""
    env = dict(os.environ) if env is None else env
    out: dict[str, Any] = {}
    servers = env.get(OXIA_ENV, "0")
    if not servers.isdigit() or int(servers) > 9:
        raise ValueError(f"{OXIA_ENV} must be a number of Oxia data servers from 0 "
                         "(one standalone server) to 9")
    if int(servers):
        out["oxia_cluster"] = OxiaClusterConfig.on_free_ports(
            int(servers), replication=min(3, int(servers)))
    drives = env.get(DRIVES_ENV, "1")
    if not drives.isdigit() or not 1 <= int(drives) <= 16:
        raise ValueError(f"{DRIVES_ENV} must be a number of drives from 1 to 16")
    out["s3_drives"] = int(drives)
    return out
