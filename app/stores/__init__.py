"""The clients of the two stores the log lives in, one package each: Oxia (``oxia/``: the
coordination records, committed by compare-and-set) and S3 (``s3/``: the WAL and
compacted objects). They know no log: keys and bytes in, keys and bytes out, each call
timed and counted (``metrics``) and each failure turned into the engine's errors
(app/errors.py). The log's own concepts, which use them, are in app/storage/.

Outside each package, only its surface is imported (tests/test_architecture.py,
``STORE_SURFACES``): ``oxia.store`` (and ``oxia.notifications``, ``oxia.patches``),
``s3.store``.
"""
