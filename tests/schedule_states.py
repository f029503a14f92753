"""Commit a scheduled-delivery state into a lake (as an ingest run would leave it), for tests of its readers."""

from __future__ import annotations

from dataclasses import replace

from rmqlake.lake import Lake
from rmqlake.lake.state import ScheduleState


def commit_schedule_state(root, schedule: ScheduleState) -> None:
    """One run that changes no table and leaves the lake state's ``schedule`` section as ``schedule``."""
    run = Lake(str(root)).begin("test")
    run.commit(state=replace(run.state, schedule=schedule))
