"""Dispatch commitlog messages after the last dispatched offset into the ConsumeQueue and IndexFile tables.

    spark-submit --py-files dist/rmqlake.zip jobs/reput.py --conf conf --lake /data/lake

Options are those of ``rmqlake reput``.
"""

import sys

from _bootstrap import run_job

if __name__ == "__main__":
    sys.exit(run_job("reput", sys.argv[1:]))
