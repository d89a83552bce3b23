"""Where an Iceberg export's table lives: the pyiceberg catalog that names it, and the
FileIO properties the tasks write its data files with.

The catalog is any pyiceberg supports (SQL, REST, Glue, Hive, ...), configured the way
pyiceberg is (``~/.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__{NAME}__{KEY}`` environment
variables), plus ``--catalog-property KEY=VALUE`` options that win over both. For the
local stack a SQL catalog in a SQLite file is enough
(``--catalog-property uri=sqlite:////var/lib/llog/iceberg.db --catalog-property
warehouse=s3://lake/iceberg``).

Data files go through pyiceberg's PyArrow FileIO. Its S3 settings default to the store's
own endpoint, region and credentials (``LLOG_S3_*``), so a table beside the log needs no
more; a catalog configured with any ``s3.*`` or ``client.*`` property of its own gets
none of the store's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from app.settings import S3Settings, StoreSettings

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

PYARROW_FILE_IO = "pyiceberg.io.pyarrow.PyArrowFileIO"
# The properties a task needs to write data files (the FileIO's); the catalog's own
# (its URI, tokens, credentials) stay on the driver.
FILE_IO_PREFIXES = ("py-io-impl", "s3.", "client.", "gcs.", "adls.", "hdfs.", "oss.")


def parse_properties(items: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` options as a dict (a later key wins)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--catalog-property {item!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out


def store_file_io(s3: S3Settings) -> dict[str, str]:
    """PyArrow FileIO properties for the store's S3 endpoint (``LLOG_S3_*``)."""
    props = {"py-io-impl": PYARROW_FILE_IO, "s3.region": s3.s3_region}
    if s3.s3_endpoint:
        props["s3.endpoint"] = s3.s3_endpoint
    if s3.s3_access_key is not None and s3.s3_secret_key is not None:
        props["s3.access-key-id"] = s3.s3_access_key.get_secret_value()
        props["s3.secret-access-key"] = s3.s3_secret_key.get_secret_value()
    return props


def catalog_properties(name: str, s3: S3Settings, options: Mapping[str, str]
                       ) -> dict[str, str]:
    """The catalog's properties: the store's FileIO defaults, under pyiceberg's own
    configuration of ``name``, under ``options``."""
    from pyiceberg.utils.config import Config

    configured = {k: str(v) for k, v in (Config().get_catalog_config(name) or {}).items()}
    given = {**configured, **options}
    # A catalog with S3 settings of its own (another endpoint or account) gets none of
    # the store's: mixing them would pair one account's key with another's endpoint.
    own_s3 = any(k.startswith(("s3.", "client.")) for k in given)
    props = {**({"py-io-impl": PYARROW_FILE_IO} if own_s3 else store_file_io(s3)),
             **given}
    if "uri" not in props and "type" not in props and "py-catalog-impl" not in props:
        raise ValueError(
            f"no Iceberg catalog {name!r} is configured: pass --catalog-property "
            "uri=sqlite:////path/catalog.db (a SQL catalog in SQLite) or another "
            f"catalog's properties, or set PYICEBERG_CATALOG__{name.upper()}__URI")
    return props


def open_catalog(name: str, s3: S3Settings, options: Mapping[str, str]) -> Catalog:
    from pyiceberg.catalog import load_catalog

    return load_catalog(name, **catalog_properties(name, s3, options))


def file_io_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """What the tasks need of a table's FileIO properties."""
    return {k: v for k, v in properties.items() if k.startswith(FILE_IO_PREFIXES)}


def check_location(table: str, location: str, s3: S3Settings, store: StoreSettings) -> None:
    """Refuse a table whose files would land among the store's own keys: vacuum deletes
    unreferenced objects under a partition's data/ prefix, and a table must never be
    mistaken for log data."""
    parts = urlsplit(location)
    if parts.scheme not in ("s3", "s3a") or parts.netloc != s3.s3_bucket:
        return
    prefix = parts.path.strip("/")
    root = store.root_prefix
    if prefix == root or prefix.startswith(f"{root}/"):
        raise ValueError(f"--table {table}: its location {location} is inside the store's "
                         f"root prefix ({s3.s3_bucket}/{root}/); give the catalog "
                         "another warehouse")


SECRET_WORDS = ("secret", "token", "credential", "password", "key-id", "session")


def redacted(items: Sequence[str]) -> list[str]:
    """``KEY=VALUE`` options as a report may show them: secrets' values, and passwords
    in URIs, replaced."""
    out = []
    for item in items:
        key, _, value = item.partition("=")
        if any(word in key.lower() for word in SECRET_WORDS):
            value = "<redacted>"
        elif "://" in value:
            parts = urlsplit(value)
            if parts.password is not None:
                value = value.replace(f":{parts.password}@", ":<redacted>@", 1)
        out.append(f"{key}={value}")
    return out


def data_file_io(properties: Mapping[str, str], location: str) -> Any:
    """The FileIO a task writes data files with (PyArrow's unless configured)."""
    from pyiceberg.io import load_file_io

    return load_file_io(dict(properties), location)
