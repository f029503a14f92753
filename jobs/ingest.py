"""Ingest raw producer logs into the commitlog, segments and rejected tables.

    spark-submit --py-files dist/rmqlake.zip jobs/ingest.py \
        --conf conf --lake /data/lake --input '/landing/dt=2026-11-21/hour=04/'

``dist/rmqlake.zip`` (``make package``) carries the library to the executors;
``--conf`` is read on the driver only. Options are those of ``rmqlake ingest``.
"""

import sys

from _bootstrap import run_job

if __name__ == "__main__":
    sys.exit(run_job("ingest", sys.argv[1:]))
