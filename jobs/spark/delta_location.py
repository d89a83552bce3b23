"""Where a Delta table lives, and how delta-rs (driver) and pyarrow (tasks) reach it.

A table is ``s3://bucket/prefix`` on the store's own S3 endpoint (``LLOG_S3_*``: the
endpoint, region, credentials and CA bundle the brokers use), or a local directory.
delta-rs commits with conditional PUTs (``If-None-Match: *`` on the next
``_delta_log/{version}.json``), which S3 and MinIO honour, so two writers can never both
commit the same version and no lock table is needed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from app.settings import S3Settings, StoreSettings


@dataclass(frozen=True)
class TableLocation:
    """A table's URI for delta-rs, its storage options, and the path pyarrow writes to."""

    uri: str
    storage_options: dict[str, str]
    is_s3: bool

    @property
    def base_path(self) -> str:
        """The table's root as a pyarrow filesystem path (``bucket/prefix`` on S3)."""
        if self.is_s3:
            parts = urlsplit(self.uri)
            return f"{parts.netloc}{parts.path}".rstrip("/")
        return self.uri.rstrip("/")


def table_location(table: str, s3: S3Settings, store: StoreSettings) -> TableLocation:
    """``table`` (``s3://bucket/prefix``, or a local path) on the store's S3 endpoint,
    outside the store's own keys."""
    if table.startswith(("s3://", "s3a://")):
        parts = urlsplit(table)
        if not parts.netloc or parts.path.strip("/") == "":
            raise ValueError(f"--table {table}: give a bucket and a prefix "
                             "(s3://bucket/prefix)")
        prefix = parts.path.strip("/")
        if parts.netloc == s3.s3_bucket and (
                prefix == store.root_prefix or prefix.startswith(f"{store.root_prefix}/")):
            # The store's own keys: vacuum deletes unreferenced objects under a
            # partition's data/ prefix, and a table must never be mistaken for log data.
            raise ValueError(f"--table {table}: inside the store's root prefix "
                             f"({s3.s3_bucket}/{store.root_prefix}/); use "
                             "another prefix or bucket")
        return TableLocation(f"s3://{parts.netloc}/{prefix}", _s3_options(s3), True)
    if "://" in table:
        raise ValueError(f"--table {table}: only s3:// URIs and local paths are supported")
    return TableLocation(os.path.abspath(table), {}, False)


def _s3_options(s3: S3Settings) -> dict[str, str]:
    """delta-rs (object_store) options for the store's S3 endpoint."""
    options = {"AWS_REGION": s3.s3_region, "aws_conditional_put": "etag"}
    if s3.s3_endpoint:
        options["AWS_ENDPOINT_URL"] = s3.s3_endpoint
        if s3.s3_endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    if s3.s3_access_key is not None and s3.s3_secret_key is not None:
        options["AWS_ACCESS_KEY_ID"] = s3.s3_access_key.get_secret_value()
        options["AWS_SECRET_ACCESS_KEY"] = s3.s3_secret_key.get_secret_value()
    return options


def filesystem(location: TableLocation, s3: S3Settings) -> Any:
    """A pyarrow filesystem that writes the table's data files."""
    import pyarrow.fs  # type: ignore[import-untyped,import-not-found,unused-ignore]

    if not location.is_s3:
        return pyarrow.fs.LocalFileSystem()
    kwargs: dict[str, Any] = {"region": s3.s3_region}
    if s3.s3_endpoint:
        endpoint = urlsplit(s3.s3_endpoint)
        kwargs.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme or "https")
    if s3.s3_access_key is not None and s3.s3_secret_key is not None:
        kwargs.update(access_key=s3.s3_access_key.get_secret_value(),
                      secret_key=s3.s3_secret_key.get_secret_value())
    if s3.s3_ca_bundle is not None:
        kwargs["tls_ca_file_path"] = str(s3.s3_ca_bundle)
    return pyarrow.fs.S3FileSystem(**kwargs)
