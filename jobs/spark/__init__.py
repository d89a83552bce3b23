"""Spark jobs over a leaderless-log store: audit, vacuum, backfill, export.

See docs/spark-jobs.md. Each runs as ``python -m jobs.spark.<job>``, through
``jobs.spark.cli.main([job, ...])`` or with spark-submit (``jobs/spark/submit.py``).
"""
