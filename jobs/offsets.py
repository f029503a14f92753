"""Load consumer offset snapshots (consumerOffset.json) into consumer_offsets.

    spark-submit --py-files dist/rmqlake.zip jobs/offsets.py --conf conf --lake /data/lake

Options are those of ``rmqlake offsets``.
"""

import sys

from _bootstrap import run_job

if __name__ == "__main__":
    sys.exit(run_job("offsets", sys.argv[1:]))
