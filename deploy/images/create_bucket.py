"""Creates the broker's bucket unless it exists: the compose stack's one-shot
``createbucket`` service, run with the broker image (which has botocore).

Reads ``LLOG_S3_ENDPOINT``, ``LLOG_S3_BUCKET``, ``LLOG_S3_REGION``,
``LLOG_S3_ACCESS_KEY`` and ``LLOG_S3_SECRET_KEY``, like the broker.
"""

from __future__ import annotations

import os
import sys

import botocore.session
from botocore.config import Config


def main() -> int:
    bucket = os.environ.get("LLOG_S3_BUCKET", "leaderless-log-wal")
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=os.environ.get("LLOG_S3_ENDPOINT") or None,
        region_name=os.environ.get("LLOG_S3_REGION", "us-east-1"),
        aws_access_key_id=os.environ.get("LLOG_S3_ACCESS_KEY"),
        aws_secret_access_key=os.environ.get("LLOG_S3_SECRET_KEY"),
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 10}))
    try:
        client.create_bucket(Bucket=bucket)
        print(f"created bucket {bucket}")
    except client.exceptions.BucketAlreadyOwnedByYou:
        print(f"bucket {bucket} exists")
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
