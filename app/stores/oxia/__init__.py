"""Oxia's client: :class:`~app.stores.oxia.store.OxiaStore` (``store``), over the ``oxia``
package in worker threads and ``grpc.aio`` on the event loop (``reads``, ``writes``,
``wire``, ``channels``); change notifications (``notifications``, ``notification_wire``);
shard discovery that follows a replicated cluster (``discovery``); and the fixes the
``oxia`` package needs (``patches``)."""
