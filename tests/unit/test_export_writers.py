"""How export-store cuts its file writers into the Spark tasks of its one job."""

from __future__ import annotations

from rmqlake.steps.store import _writer_groups, _Writers


def _tasks(kind: str, count: int) -> list[dict]:
    return [{"kind": kind, "n": n} for n in range(count)]


def test_segments_come_first_a_task_each_and_the_other_kinds_in_runs_of_consecutive_tasks():
    kinds = [
        _Writers(dict, _tasks("segment", 3), one_per_task=True),
        _Writers(dict, [], one_per_task=True),  # a lake without compacted queues
        _Writers(dict, _tasks("cq", 50)),
        _Writers(dict, _tasks("index", 2)),
    ]
    groups = _writer_groups(kinds, slices=8)

    assert [number for number, _, _ in groups] == [0] * 3 + [2] * 8 + [3] * 2
    assert [tasks for number, _, tasks in groups if number == 0] == [[task] for task in kinds[0].tasks]
    cq = [tasks for number, _, tasks in groups if number == 2]
    assert [task for run in cq for task in run] == kinds[2].tasks  # every task once, in order
    assert {len(run) for run in cq} == {6, 7}  # as even as the cut of ``parallelize``
    assert all(write is dict for _, write, _ in groups)


def test_no_tasks_no_groups():
    assert _writer_groups([_Writers(dict, []), _Writers(dict, [], one_per_task=True)], slices=8) == []
