"""Compact COMPACTION topics: the latest message per key into compaction_log and compaction_cq.

    spark-submit --py-files dist/rmqlake.zip jobs/compact.py --conf conf --lake /data/lake

Options are those of ``rmqlake compact``.
"""

import sys

from _bootstrap import run_job

if __name__ == "__main__":
    sys.exit(run_job("compact", sys.argv[1:]))
