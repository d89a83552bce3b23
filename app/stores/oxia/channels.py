"""``grpc.aio`` channels to Oxia's shard leaders, for the calls made on the event loop.

Which shard a partition key maps to, and which server leads it, come from the ``oxia``
package's own discovery (app/stores/oxia/discovery.py), which follows leader changes;
this only keeps one channel per leader, opened on first use on the running loop (which
``grpc.aio`` needs) and closed by :meth:`LeaderChannels.aclose`.
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

from app.stores.oxia.wire import NotUnderstood


class LeaderChannels:
    """A channel per shard leader, and the shard of a partition key."""

    def __init__(self, client: Any, *, credentials: grpc.ChannelCredentials | None,
                 options: list[tuple[str, Any]]) -> None:
        self._discovery = client._service_discovery
        self._credentials = credentials
        self._options = options
        self._channels: dict[str, grpc.aio.Channel] = {}

    def shard(self, partition_key: str) -> Any:
        """The shard of ``partition_key`` (``.shard``, ``.leader``: "" during an
        election); :class:`NotUnderstood` before the first assignments arrive, for which
        the package waits."""
        try:
            return self._discovery.get_shard(partition_key)
        except Exception as exc:
            raise NotUnderstood(f"no shard for {partition_key!r}: {exc}") from exc

    def leader(self, partition_key: str) -> tuple[int, grpc.aio.Channel]:
        """The shard of ``partition_key`` and a channel to its leader;
        :class:`NotUnderstood` while the shard has none (an election), which the
        package reports as it sees fit."""
        shard = self.shard(partition_key)
        if not shard.leader:
            raise NotUnderstood(f"shard {shard.shard} has no leader yet")
        return shard.shard, self.channel(shard.leader)

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = (grpc.aio.insecure_channel(address, options=self._options)
                       if self._credentials is None else
                       grpc.aio.secure_channel(address, self._credentials,
                                               options=self._options))
            self._channels[address] = channel
        return channel

    async def aclose(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
