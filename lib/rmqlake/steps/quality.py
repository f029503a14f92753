"""The quality job: run the suites on Spark DataFrames with Great Expectations, keep one ``dq_results`` row per
expectation, and build the Data Docs.

The GX project is a file context (``quality.project_dir``, by default
``<lake>/_quality``), so the Data Docs keep every run's results, browsable
over time. Results rows are committed through the ledger like any run: a
run that races a writer is recomputed on the new tables, so the versions
recorded are the versions checked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from rmqlake.config import Settings
from rmqlake.errors import UsageError
from rmqlake.lake import Lake
from rmqlake.lake.spark_io import read_table
from rmqlake.lake.state import LakeState, QualityState, SuiteCheck
from rmqlake.lake.tables import DQ_RESULTS
from rmqlake.progress import in_another_thread
from rmqlake.quality import report
from rmqlake.quality.suites import CRITICAL, Suite, select_suites
from rmqlake.steps.offsets import queue_bounds
from rmqlake.steps.runner import StepRun, run_step

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)
DATASOURCE = "rmqlake"
DOCS_SITE = "rmqlake_site"


def project_dir(settings: Settings) -> Path:
    """The GX project folder: ``quality.project_dir``, else ``_quality`` inside a local lake folder."""
    if settings.quality.project_dir:
        return Path(settings.quality.project_dir)
    root = settings.lake.root
    if "://" in root and not root.startswith("file://"):
        raise UsageError(
            f"quality.project_dir is required for a lake at {root}: the Data Docs are written to a local folder"
        )
    return Path(root.removeprefix("file://")) / "_quality"


def quality(spark, settings: Settings, *, suites: list[str] | None = None, now: datetime | None = None) -> dict:
    """Run the quality suites (all, or ``suites``) on the lake's current tables.

    Returns:
        Metrics: ``status`` (``checked``, or ``already_checked`` when every
        suite already ran on the same table versions: nothing is written and
        their last outcome is reported, a failure too), ``suites`` (one
        summary each: expectations, failed, severity, table versions, the run
        that checked them), ``critical_failures``, ``warnings``,
        ``data_docs`` (index.html), ``report`` (this run's HTML page with plots, with
        ``quality.report``); and the stable ones (``rows_in``: rows the suites
        checked in this run validated, ``rows_out``: ``dq_results`` rows
        written).
    """
    try:
        chosen = select_suites(suites)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    docs_root = project_dir(settings)

    def work(step: StepRun) -> dict:
        return _check(spark, settings, step, chosen, docs_root=docs_root)

    return run_step("quality", settings, work, now=now)


def _check(spark, settings, step: StepRun, chosen: list[Suite], *, docs_root) -> dict:
    lake, run, now, started = step.lake, step.run, step.now, step.started
    checked = dict((run.state.quality or QualityState()).checked)
    names = sorted({t for suite in chosen for t in suite.tables})
    versions = {name: lake.version(name) for name in names}

    def unchanged(suite: Suite) -> bool:
        return suite.name in checked and checked[suite.name].table_versions == {t: versions[t] for t in suite.tables}

    todo = [s for s in chosen if not unchanged(s)]
    # suites whose tables did not change since they were checked: their last outcome stands (a failure too)
    summaries = [{**checked[s.name].to_json(), "seconds": 0.0} for s in chosen if unchanged(s)]
    context = _context(docs_root)
    if not todo:
        log.info("every suite already ran on these table versions (%s); reporting their last outcome", versions)
        return _result("already_checked", summaries, context, started)
    tables = suite_inputs(spark, lake, run.state, names)
    source = spark_source(context)
    rows = []
    suite_started = time.monotonic()  # a suite's seconds include the wait for its frame
    # closed on the way out of a failed suite too: that releases its frame and the next one
    with contextlib.closing(_frames_ahead(todo, tables, settings)) as frames:
        for suite, frame in frames:
            result = _validate(context, source, suite, suite.expectations(settings), frame, settings)
            suite_rows = _result_rows(suite, result, run_id=run.run_id, table_version=versions[suite.table], now=now)
            rows += suite_rows
            failed = sum(not row["success"] for row in suite_rows)
            outcome = SuiteCheck(
                suite=suite.name,
                severity=suite.severity,
                expectations=len(result.results),
                failed=failed,
                rows=(result.results[0].result or {}).get("element_count") if result.results else None,
                table_versions={t: versions[t] for t in suite.tables},
                run_id=run.run_id,
            )
            log.info("%s: %d expectations, %d failed", suite.name, len(result.results), failed)
            checked[suite.name] = outcome
            suite_ended = time.monotonic()
            summaries.append({**outcome.to_json(), "seconds": round(suite_ended - suite_started, 3)})
            suite_started = suite_ended
    run.stage_arrow("dq_results", pa.Table.from_pylist(rows, schema=DQ_RESULTS.arrow_schema), mode="append")
    metrics = _result("checked", summaries, context, started)
    metrics.update(rows_in=sum(checked[s.name].rows or 0 for s in todo), rows_out=len(rows))
    record = {
        **{k: metrics[k] for k in ("critical_failures", "warnings")},
        "suites": len(summaries),
        **{k: metrics[k] for k in ("rows_in", "rows_out")},
    }
    versions = step.commit(replace(run.state, quality=QualityState(checked=checked)), record=record)
    context.build_data_docs(site_names=[DOCS_SITE])
    docs = _docs_index(context)
    page = None
    if settings.quality.report:
        reports = docs_root / "reports"
        page = report.render(
            report.gather(spark, lake, settings),
            reports / run.run_id,
            run_id=run.run_id,
            suites=summaries,
            data_docs=docs,
        )
        report.link_latest(reports, page)
    return {
        **metrics,
        "data_docs": docs,
        "report": None if page is None else str(page.resolve()),
        "run_id": run.run_id,
        "table_versions": versions,
    }


def _result_rows(suite: Suite, result, *, run_id: str, table_version: int, now) -> list[dict]:
    """One ``dq_results`` row per expectation of a suite's GX result; a failure is logged as it is kept."""
    rows = []
    for outcome in result.results:
        config = outcome.expectation_config
        observed = {
            "type": config.type,
            "kwargs": {k: v for k, v in config.kwargs.items() if k != "batch_id"},
            **{k: v for k, v in (outcome.result or {}).items() if k != "partial_unexpected_index_list"},
        }
        rows.append(
            {
                "run_id": run_id,
                "suite": suite.name,
                "table_name": suite.table,
                "expectation": config.description or config.type,
                "success": bool(outcome.success),
                "observed": json.dumps(observed, default=str, sort_keys=True),
                "severity": suite.severity,
                "table_version": table_version,
                "checked_at": now,
            }
        )
        if not outcome.success:
            level = logging.ERROR if suite.severity == CRITICAL else logging.WARNING
            log.log(level, "%s FAILED: %s; observed %s", suite.name, config.description, observed)
    return rows


def _frames_ahead(todo: list[Suite], tables: dict, settings: Settings) -> Iterator[tuple[Suite, DataFrame]]:
    """Each suite with its frame, persisted and computed; the next suite's frame is computed while the caller
    validates this one.

    GX computes each expectation's metrics with their own Spark jobs: the frame is kept instead of recomputing
    its joins, windows and recomputed byte rules for each of them. Persisted here, not by GX (see
    ``spark_source``), so that it is released when its suite is done: at most two frames are kept at a time.
    Most of a suite's validation is small Spark jobs run one after the other, and GX's Python between them,
    so the next frame's scan and joins use the cores they leave idle."""

    def computed(suite: Suite) -> DataFrame:
        frame = suite.frame(tables, settings).persist()
        try:
            frame.count()  # the first action on a persisted frame computes and keeps all of it
        except Exception:
            # GX meets the same error in the suite's first metric and reports it in the suite's results (failed
            # expectations with the exception), as it did when the frame was first computed inside GX
            log.debug("computing the frame of %s failed; its validation reports the error", suite.name, exc_info=True)
        return frame

    compute = in_another_thread(computed)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="quality-frame") as pool:
        ahead = pool.submit(compute, todo[0]) if todo else None
        try:
            for number, suite in enumerate(todo):
                frame, ahead = ahead.result(), None
                try:
                    if number + 1 < len(todo):
                        ahead = pool.submit(compute, todo[number + 1])
                    yield suite, frame
                finally:
                    frame.unpersist()
        finally:
            # the caller stopped early (a failed validation): release the frame computed ahead
            if ahead is not None and not ahead.cancel() and ahead.exception() is None:
                ahead.result().unpersist()


def _result(status: str, summaries: list[dict], context, started: float) -> dict:
    return {
        "status": status,
        "suites": summaries,
        "critical_failures": sum(s["failed"] for s in summaries if s["severity"] == CRITICAL),
        "warnings": sum(s["failed"] for s in summaries if s["severity"] != CRITICAL),
        "data_docs": _docs_index(context),
        "seconds": round(time.monotonic() - started, 3),
    }


def suite_inputs(spark, lake: Lake, state: LakeState, names: list[str]) -> dict:
    """What suite frames read: the tables ``names`` as DataFrames, the queue min offsets expiry corrected
    (``queue_min_offsets``: topic, queue_id, min_offset), the commitlog's ``min_physical_offset``, each
    COMPACTION topic's ``compaction_positions``, ``expire_as_of`` (the last applied expiry run's time),
    ``queue_bounds`` (topic, queue_id, min_offset, max_offset) and ``schedule`` (the delay-level and timer
    deliveries' state, ``None`` before any)."""
    inputs: dict = {name: read_table(spark, lake, name) for name in names}
    inputs["queue_min_offsets"] = spark.createDataFrame(
        [(topic, queue, value) for (topic, queue), value in sorted(state.queue_min_offsets.items())],
        "topic string, queue_id int, min_offset bigint",
    )
    inputs["min_physical_offset"] = lake.min_physical_offset()
    inputs["expire_as_of"] = state.expire.last_now if state.expire else None
    inputs["queue_bounds"] = spark.createDataFrame(
        [(topic, queue, low, high) for (topic, queue), (low, high) in queue_bounds(lake, state).items()],
        "topic string, queue_id int, min_offset bigint, max_offset bigint",
    )
    inputs["compaction_positions"] = dict(state.compaction.positions) if state.compaction else {}
    inputs["schedule"] = state.schedule
    return inputs


def _context(root: Path):
    """The GX file project at ``root`` with a local Data Docs site (created on first use)."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    root.mkdir(parents=True, exist_ok=True)
    context = gx.get_context(mode="file", project_root_dir=str(root))
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    context.variables.analytics_enabled = False  # a batch job never phones home (and this machine is offline)
    if DOCS_SITE not in context.get_site_names():
        context.add_data_docs_site(
            site_name=DOCS_SITE,
            site_config={
                "class_name": "SiteBuilder",
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": "data_docs",
                },
            },
        )
    return context


def _docs_index(context) -> str:
    return context.get_docs_sites_urls(site_name=DOCS_SITE)[0]["site_url"]


def spark_source(context):
    """The project's GX Spark datasource, registered with ``persist=False``: the quality job persists each
    suite's frame itself and releases it after the suite (GX would persist it a second time, and keep it).
    Once a run: each registration rewrites the project's ``great_expectations.yml``."""
    return context.data_sources.add_or_update_spark(name=DATASOURCE, persist=False)


def _validate(context, source, suite: Suite, expectations: list, frame, settings: Settings):
    """Validate ``frame`` with the suite's expectations through GX's Spark datasource ``source``; the result is
    stored in the project (for the Data Docs)."""
    import great_expectations as gx

    try:
        asset = source.get_asset(suite.name)
    except LookupError:
        asset = source.add_dataframe_asset(name=suite.name)
    try:
        batch = asset.get_batch_definition("whole table")
    except KeyError:
        batch = asset.add_batch_definition_whole_dataframe("whole table")
    expectation_suite = gx.ExpectationSuite(name=suite.name, expectations=expectations)
    expectation_suite = context.suites.add_or_update(expectation_suite)
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=suite.name, data=batch, suite=expectation_suite)
    )
    return definition.run(
        batch_parameters={"dataframe": frame},
        result_format={
            "result_format": "SUMMARY",
            "partial_unexpected_count": settings.quality.partial_unexpected_count,
        },
    )
