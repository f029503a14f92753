"""Write the lake (or the lake as of a run) as a broker store directory.

    spark-submit --py-files dist/rmqlake.zip jobs/export_store.py --conf conf --lake /data/lake --out /data/store

Options are those of ``rmqlake export-store``.
"""

import sys

from _bootstrap import run_job

if __name__ == "__main__":
    sys.exit(run_job("export-store", sys.argv[1:]))
