"""Entry file for spark-submit: ``spark-submit [...] jobs/spark/submit.py <job> [...]``.

spark-submit runs a Python file, not a module; this one hands over to
:func:`jobs.spark.cli.main`, so the executors import the jobs' functions from the
``jobs`` package (installed, or shipped with ``--py-files``).
"""

import sys

from jobs.spark.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
