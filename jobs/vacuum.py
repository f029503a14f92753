"""Delete data files that runs removed from the tables longer ago than lake.vacuum_retention_hours.

    spark-submit --py-files dist/rmqlake.zip jobs/vacuum.py --conf conf --lake /data/lake

Options are those of ``rmqlake vacuum``.
"""

import sys

from _bootstrap import run_job

if __name__ == "__main__":
    sys.exit(run_job("vacuum", sys.argv[1:]))
