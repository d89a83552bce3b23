"""``python -m jobs.spark <job> ...`` (same as ``llog spark <job> ...``)."""

import sys

from jobs.spark.cli import main

sys.exit(main(sys.argv[1:]))
