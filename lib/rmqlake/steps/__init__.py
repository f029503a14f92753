"""Job bodies: read through ``lake``, call ``transforms``, stage, commit, return metrics.

``jobs/*.py`` and the CLI call these; each returns a metrics dict with
stable keys (``rows_in``, ``rows_out``, ``rejected``, ``files_added``,
``table_versions``, ``seconds``, ...).
"""
