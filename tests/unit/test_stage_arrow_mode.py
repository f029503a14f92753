"""``LakeRun.stage_arrow`` stages like its siblings ``op`` and ``collect_staged``: append unless told otherwise."""

from __future__ import annotations

import pytest

from rmqlake.lake import Lake
from rmqlake.lake.tables import INGEST_FILES, SEGMENTS


def test_stage_arrow_appends_by_default_as_op_does(tmp_path):
    run = Lake(str(tmp_path / "lake")).begin("test")
    run.stage_arrow("ingest_files", INGEST_FILES.arrow_schema.empty_table())
    assert run.op("ingest_files").mode == "append"  # op's default: the same table op, no mode clash
    run.stage_arrow("segments", SEGMENTS.arrow_schema.empty_table(), mode="overwrite")
    assert run.ops["segments"].mode == "overwrite"
    with pytest.raises(ValueError, match="already staged with mode overwrite, not append"):
        run.stage_arrow("segments", SEGMENTS.arrow_schema.empty_table())
