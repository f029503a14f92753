"""The delta-spark engine: table commits through the Delta Lake Spark extension.

Same layout and the same commits as the delta-rs engine: Spark stages the
Parquet files, then one Delta commit per table adds them (and removes what
the run removes) together with the run's app transactions, through Delta's
own ``OptimisticTransaction`` (``DeltaLog.startTransaction().commit``), so the
extension's conflict checks apply. The actions are handed over as Delta log
JSON (``Action.fromJson``), the protocol's stable form, not as Scala
constructors; a table is created the same way (protocol and metadata
actions, with the table properties every engine uses). Spark
jobs read the tables with ``spark.read.format("delta")`` at the version the
lake pins (``spark_io.read_table``); metadata reads (versions, app
transactions, file statistics), vacuum and the ``_rmqlake_ledger`` table stay
with delta-rs, which reads any Delta table.

Only Delta's SQL and its ``DeltaLog`` are used, never the ``io.delta.tables``
API (``delta.tables.DeltaTable``): Delta 4.1.0 is compiled against Spark
4.1.0, whose ``IgnoreCachedData`` Spark 4.1.3 no longer has, and that class
(with the ALTER TABLE commands) fails to load on the pinned Spark.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Literal
from urllib.parse import quote

from rmqlake.errors import CommitConflictError, ConfigError
from rmqlake.lake.actions import DataFile
from rmqlake.lake.deltars import DeltaRsEngine
from rmqlake.lake.tables import TABLE_PROPERTIES, TableSpec

log = logging.getLogger(__name__)

EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
_MISSING = (
    "lake.engine is delta-spark but {what}. Run `make jars` once (Maven fetches the pinned Delta Lake jars into "
    ".jars/delta; rmqlake gives them to Spark with spark.jars); under spark-submit pass them yourself: "
    "--jars .jars/delta/delta-spark_2.13-4.1.0.jar,.jars/delta/delta-storage-4.1.0.jar "
    f"(spark.sql.extensions={EXTENSION} and spark.sql.catalog.spark_catalog={CATALOG} are set by rmqlake); "
    "or use lake.engine=delta-rs"
)
# Delta's conflict exceptions (io.delta.exceptions.*): another commit won; the run is recomputed or retried.
_CONFLICT = re.compile(r"Concurrent\w*Exception|ProtocolChangedException|MetadataChangedException")
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def require_delta_extension(spark) -> None:
    """Fail at start-up, before anything is written, when the Delta extension is not usable in ``spark``.

    Raises:
        ConfigError: the extension is not configured, or its classes are not on the classpath.
    """
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if EXTENSION not in extensions:
        raise ConfigError(_MISSING.format(what=f"spark.sql.extensions ({extensions or 'unset'}) lacks {EXTENSION}"))
    jvm = spark._jvm
    try:  # spark.jars are in the context class loader, not the JVM's system one
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName("org.apache.spark.sql.delta.DeltaLog", False, loader)
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


def create_table_actions(spec: TableSpec, *, schema_json: str, table_id: str, now_ms: int) -> list[dict]:
    """The protocol and metadata actions that create ``spec`` (version 0), with rmqlake's table properties."""
    metadata = {
        "id": table_id,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": schema_json,
        "partitionColumns": list(spec.partition_by),
        "configuration": dict(TABLE_PROPERTIES),
        "createdTime": now_ms,
    }
    if spec.description:
        metadata["description"] = spec.description
    return [{"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}, {"metaData": metadata}]


class DeltaSparkEngine(DeltaRsEngine):
    """Commits (and table creation) through the Delta Spark extension of the active SparkSession."""

    name = "delta-spark"

    def _spark(self):
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise ConfigError("lake.engine is delta-spark: commits need the job's SparkSession, and none is active")
        require_delta_extension(spark)
        return spark

    def ensure_table(self, spec: TableSpec) -> None:
        """Create ``spec`` empty if it does not exist (a concurrent creation is fine).

        Committed as version 0 through ``DeltaLog``, not ``CREATE TABLE IF NOT EXISTS``, which takes a
        folder that already holds files (this run's staging folder) for an existing table and creates nothing.
        """
        if self.exists(spec.name):
            return
        spark = self._spark()
        # each field's COMMENT becomes its metadata {"comment": ...}, as in a table Spark's SQL creates
        schema_json = spark._jvm.org.apache.spark.sql.types.StructType.fromDDL(spec.schema.commented_ddl).json()
        actions = create_table_actions(spec, schema_json=schema_json, table_id=str(uuid.uuid4()), now_ms=_now_ms())
        try:
            self._commit(spark, spec.name, actions, metadata={"rmqlake.created": spec.name})
        except CommitConflictError:  # another process created it first
            if not self.exists(spec.name):
                raise

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
        """Commit ``adds`` (files already in place) and ``removes`` in one Delta commit, as delta-rs does.

        ``metadata`` becomes the commit's ``userMetadata`` (JSON).

        Returns:
            The new table version.

        Raises:
            CommitConflictError: Delta's conflict check refused the commit.
        """
        self.ensure_table(spec)
        spark = self._spark()
        delta = spark._jvm.org.apache.spark.sql.delta
        txn = delta.DeltaLog.forTable(spark._jsparkSession, self.uri(spec.name)).startTransaction()
        now_ms = _now_ms()
        for app_id in app_transactions:
            txn.txnVersion(app_id)  # read: a concurrent commit of the same app id now conflicts
        if mode == "overwrite":  # every file of the version the transaction read goes
            txn.readWholeTable()  # and a concurrent append conflicts instead of surviving the overwrite
            named = {f.path for f in removes}
            removes = [
                *removes,
                *(f for f in self.active_files(spec.name, version=txn.readVersion()) if f.path not in named),
            ]
        actions = [add_action(f) for f in adds]
        actions += [remove_action(f, deletion_timestamp=deletion_timestamp or now_ms) for f in removes]
        actions += [txn_action(a, v, now_ms=now_ms) for a, v in app_transactions.items()]
        return self._commit(spark, spec.name, actions, metadata=metadata, txn=txn)

    def _commit(self, spark, table: str, actions: list[dict], *, metadata: Mapping[str, str], txn=None) -> int:
        """Commit ``actions`` (Delta log JSON) in ``txn`` (a new transaction when ``None``).

        Raises:
            CommitConflictError: Delta's conflict check refused the commit.
        """
        jvm = spark._jvm
        delta = jvm.org.apache.spark.sql.delta
        if txn is None:
            txn = delta.DeltaLog.forTable(spark._jsparkSession, self.uri(table)).startTransaction()
        parsed = jvm.java.util.ArrayList()
        for action in actions:
            parsed.add(delta.actions.Action.fromJson(json.dumps(action)))
        operation = getattr(delta, "DeltaOperations$ManualUpdate$").__getattr__("MODULE$")
        seq = jvm.scala.jdk.javaapi.CollectionConverters.asScala(parsed).toSeq()
        try:
            if metadata:
                spark.conf.set(USER_METADATA, json.dumps(dict(metadata), sort_keys=True))
            version = txn.commit(seq, operation)
        except Exception as exc:
            if _CONFLICT.search(str(exc)):
                raise CommitConflictError(
                    f"commit to table {table} conflicted with a concurrent commit: {str(exc).splitlines()[0]}"
                ) from exc
            raise
        finally:
            spark.conf.unset(USER_METADATA)
        log.debug("committed %s version %d through the Delta extension", table, version)
        return int(version)


def _now_ms() -> int:
    return int(time.time() * 1000)
