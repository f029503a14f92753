"""Times on the command line: epoch milliseconds, ISO-8601 and mqadmin's yyyy-MM-dd#HH:mm:ss:SSS."""

from __future__ import annotations

import pytest

from rmqlake import cli
from rmqlake.errors import UsageError
from rmqlake.timeutil import parse_timestamp
from tests.conftest import CONF

T0 = 1_795_219_200_000  # 2026-11-21T00:00:00Z


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-21#00:00:00:000", T0),
        ("2026-11-21#13:45:07:009", T0 + ((13 * 60 + 45) * 60 + 7) * 1000 + 9),
        (" 2026-11-21#00:00:01:250 ", T0 + 1250),
        ("2026-11-21T00:00:01.250Z", T0 + 1250),  # the same moment in ISO-8601
        (str(T0 + 1250), T0 + 1250),
    ],
)
def test_mqadmin_times_are_utc_milliseconds(text, expected):
    assert parse_timestamp(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "2026-13-21#00:00:00:000",  # month 13 (SimpleDateFormat would roll it over; refused here)
        "2026-11-21#24:00:00:000",
        "2026-11-21#00:00:00:00",  # two digits of milliseconds
        "2026-11-21#00:00:00.000",
        "0000-01-01#00:00:00:000",
        "2026-11-21#00:00:00:\u0661\u0662\u0663",  # non-ASCII digits
    ],
)
def test_malformed_mqadmin_times_are_refused_naming_the_forms(text):
    with pytest.raises(UsageError, match=r"nor yyyy-MM-dd#HH:mm:ss:SSS \(e\.g\. 2026-11-22#04:00:00:000\)"):
        parse_timestamp(text, option="--begin")


def test_the_command_line_checks_mqadmin_times_before_any_work(tmp_path, capsys):
    argv = ["expire", "--lake", str(tmp_path / "lake"), "--now", "2026-11-21#25:00:00:000"]
    assert cli.main([*argv, "--conf", str(CONF), "--env", "test"]) == 2
    assert "--now: '2026-11-21#25:00:00:000' is neither" in capsys.readouterr().err
