"""Print consumer lag per group, topic and queue (and its history over snapshots).

    spark-submit --py-files dist/rmqlake.zip jobs/lag.py --conf conf --lake /data/lake

Options are those of ``rmqlake lag``.
"""

import sys

from _bootstrap import run_job

if __name__ == "__main__":
    sys.exit(run_job("lag", sys.argv[1:]))
