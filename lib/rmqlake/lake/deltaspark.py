"""The delta-spark engine: table commits through the Delta Lake Spark extension, for clusters that have its jars.

Same layout and the same commits as the delta-rs engine: Spark stages the
Parquet files, then one Delta commit per table adds them (and removes what
the run removes) together with the run's app transactions, through Delta's
own ``OptimisticTransaction`` (``DeltaLog.startTransaction().commit``), so the
extension's conflict checks apply. The actions are handed over as Delta log
JSON (``Action.fromJson``), the protocol's stable form, not as Scala
constructors. Reads and metadata stay with delta-rs, which reads any Delta
table; Spark jobs read the tables with ``spark.read.format("delta")``. The
ledger table is always committed with delta-rs.

It cannot run on the machines this project is developed on (no Maven
access, so no Delta jars): the tests that exercise it are skipped there,
with that reason; the start-up check and the action JSON are tested.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Literal
from urllib.parse import quote

from rmqlake.errors import CommitConflictError, ConfigError
from rmqlake.lake.actions import DataFile
from rmqlake.lake.deltars import DeltaRsEngine
from rmqlake.lake.tables import TableSpec

EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
_MISSING = (
    "lake.engine is delta-spark but {what}. Put the Delta Lake jars on the classpath (e.g. spark-submit "
    "--jars delta-spark_2.13-4.1.0.jar,delta-storage-4.1.0.jar; Databricks runtimes have them) and set "
    f"spark.sql.extensions={EXTENSION} and spark.sql.catalog.spark_catalog={CATALOG}; or use lake.engine=delta-rs"
)


def require_delta_extension(spark) -> None:
    """Fail at start-up, before anything is written, when the Delta extension is not usable in ``spark``.

    Raises:
        ConfigError: the extension is not configured, or its classes are not on the classpath.
    """
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if EXTENSION not in extensions:
        raise ConfigError(_MISSING.format(what=f"spark.sql.extensions ({extensions or 'unset'}) lacks {EXTENSION}"))
    try:
        spark._jvm.java.lang.Class.forName("org.apache.spark.sql.delta.DeltaLog")
    except Exception as exc:  # py4j wraps ClassNotFoundException
        raise ConfigError(_MISSING.format(what="the Delta Lake classes are not on the classpath")) from exc


def add_action(data_file: DataFile) -> dict:
    return {
        "add": {
            "path": log_path(data_file.path),
            "partitionValues": dict(data_file.partition_values),
            "size": data_file.size,
            "modificationTime": data_file.modification_time or int(time.time() * 1000),
            "dataChange": True,
            **({"stats": data_file.stats} if data_file.stats else {}),
        }
    }


def remove_action(data_file: DataFile, *, deletion_timestamp: int) -> dict:
    return {
        "remove": {
            "path": log_path(data_file.path),
            "deletionTimestamp": deletion_timestamp,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": dict(data_file.partition_values),
            "size": data_file.size,
        }
    }


def txn_action(app_id: str, version: int, *, now_ms: int) -> dict:
    return {"txn": {"appId": app_id, "version": version, "lastUpdated": now_ms}}


def log_path(path: str) -> str:
    """A data file path as the Delta log holds it: relative, URI-encoded (``%`` of escaped folders included)."""
    return quote(path, safe="/=")


class DeltaSparkEngine(DeltaRsEngine):
    """delta-rs reads; commits through the Delta Spark extension of the active SparkSession."""

    name = "delta-spark"

    def _spark(self):
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise ConfigError("lake.engine is delta-spark: commits need the job's SparkSession, and none is active")
        require_delta_extension(spark)
        return spark

    def ensure_table(self, spec: TableSpec) -> None:
        if self.exists(spec.name):
            return
        from delta.tables import DeltaTable

        builder = (
            DeltaTable.createIfNotExists(self._spark()).location(self.uri(spec.name)).addColumns(spec.spark_schema)
        )
        if spec.partition_by:
            builder = builder.partitionedBy(*spec.partition_by)
        builder.execute()

    def commit_files(
        self,
        spec: TableSpec,
        *,
        adds: Sequence[DataFile],
        removes: Sequence[DataFile] = (),
        mode: Literal["append", "overwrite"] = "append",
        app_transactions: Mapping[str, int],
        metadata: Mapping[str, str],
        deletion_timestamp: int = 0,
    ) -> int:
        self.ensure_table(spec)
        spark = self._spark()
        jvm = spark._jvm
        delta = jvm.org.apache.spark.sql.delta
        log = delta.DeltaLog.forTable(spark._jsparkSession, self.uri(spec.name))
        txn = log.startTransaction()
        now_ms = int(time.time() * 1000)
        for app_id in app_transactions:
            txn.txnVersion(app_id)  # read: a concurrent commit of the same app id now conflicts
        if mode == "overwrite":  # every file of the version the transaction read goes
            named = {f.path for f in removes}
            removes = [
                *removes,
                *(f for f in self.active_files(spec.name, version=txn.readVersion()) if f.path not in named),
            ]
        actions = [add_action(f) for f in adds]
        actions += [remove_action(f, deletion_timestamp=deletion_timestamp or now_ms) for f in removes]
        actions += [txn_action(a, v, now_ms=now_ms) for a, v in app_transactions.items()]
        parsed = jvm.java.util.ArrayList()
        for action in actions:
            parsed.add(delta.actions.Action.fromJson(json.dumps(action)))
        operation = getattr(delta, "DeltaOperations$ManualUpdate$").__getattr__("MODULE$")
        seq = jvm.scala.jdk.javaapi.CollectionConverters.asScala(parsed).toSeq()
        try:
            if metadata:
                spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps(dict(metadata)))
            version = txn.commit(seq, operation)
        except Exception as exc:
            if "Concurrent" in type(exc).__name__ or "Concurrent" in str(exc):
                raise CommitConflictError(
                    f"commit to table {spec.name} conflicted with a concurrent commit: {exc}"
                ) from exc
            raise
        finally:
            spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")
        return int(version)
