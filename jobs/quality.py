"""Run the data-quality suites: dq_results rows and Data Docs; exit 1 when a critical expectation fails.

    spark-submit --py-files dist/rmqlake.zip jobs/quality.py --conf conf --lake /data/lake

Options are those of ``rmqlake quality``.
"""

import sys

from _bootstrap import run_job

if __name__ == "__main__":
    sys.exit(run_job("quality", sys.argv[1:]))
