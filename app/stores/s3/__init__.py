"""S3's client: :class:`~app.stores.s3.store.S3Store` (``store``), the data path's GETs and
PUTs signed and sent by hand (``lean``, ``wire``, ``sigv4``), the rest through
aiobotocore."""
