"""Job bodies: read through ``lake``, call ``transforms``, stage, commit, return metrics.

``jobs/*.py`` and the CLI call these; each returns a metrics dict with
stable keys (``rows_in``, ``rows_out``, ``rejected``, ``files_added``,
``table_versions``, ``seconds``, ...).
"""

# The lake tables each job commits to (a job may leave some unchanged when it has nothing to do); the Airflow
# DAGs declare them as the task's outlets, so a DAG scheduled on a table's Asset runs after a job wrote it.
# vacuum only deletes files the tables no longer list and changes no table's rows; lag, export-store only read.
TABLES_WRITTEN: dict[str, tuple[str, ...]] = {
    "ingest": ("commitlog", "segments", "rejected", "ingest_files"),
    "reput": ("consumequeue", "indexfile", "indexfile_header"),
    "compact": ("compaction_log", "compaction_cq"),
    "expire": ("segments", "commitlog", "consumequeue", "indexfile", "indexfile_header"),
    "offsets": ("consumer_offsets",),
    "quality": ("dq_results",),
    "import-store": ("commitlog", "rejected", "segments"),
    "vacuum": (),
    "lag": (),
    "export-store": (),
}
