"""rmqlake: Apache RocketMQ's broker storage rebuilt as Delta Lake tables by Spark batch jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rmqlake.spark_worker import freeze_after_task_collections, in_spark_worker, keep_zip_importers

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from os import PathLike

    from rmqlake.config import Settings
    from rmqlake.reader import LakeReader

__version__ = "0.1.0"

if in_spark_worker():
    keep_zip_importers()
    freeze_after_task_collections()


def open(
    lake: str | None = None,
    *,
    conf: str | PathLike | None = None,
    env: str | None = None,
    overrides: Sequence[str] = (),
    settings: Settings | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> LakeReader:
    """Open a lake for reading from Python: lookups, status, lag and SQL as Arrow tables or pandas.

    ``rmqlake.open("lake")``; the options are the CLI's (see
    ``rmqlake.reader.open_lake``). pyarrow, deltalake and DuckDB are
    imported here, not when ``rmqlake`` is.
    """
    from rmqlake.reader import open_lake

    return open_lake(lake, conf=conf, env=env, overrides=overrides, settings=settings, storage_options=storage_options)
