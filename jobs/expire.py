"""Apply the broker's file-deletion rules as of --now: segments, then their CQ and index files.

    spark-submit --py-files dist/rmqlake.zip jobs/expire.py --conf conf --lake /data/lake

Options are those of ``rmqlake expire``.
"""

import sys

from _bootstrap import run_job

if __name__ == "__main__":
    sys.exit(run_job("expire", sys.argv[1:]))
