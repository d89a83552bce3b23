"""Compaction: rewrites runs of small WAL slices into compacted blobs (docs/protocol.md).

- :mod:`.compactor`: ``Compactor.compact_once(tp)``, the protocol with recovery.
- :mod:`.scheduler`: which partition next (seeds, discovery, claims, bounded pool).
- :mod:`.service`: hosting it in the broker or as the ``llog compactor`` service.
"""
