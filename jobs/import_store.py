"""Read a broker store's commitlog files into an empty lake; then run reput.

    spark-submit --py-files dist/rmqlake.zip jobs/import_store.py --conf conf --lake /data/lake /data/broker/store

Options are those of ``rmqlake import-store``.
"""

import sys

from _bootstrap import run_job

if __name__ == "__main__":
    sys.exit(run_job("import-store", sys.argv[1:]))
