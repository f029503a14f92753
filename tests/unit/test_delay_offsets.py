"""``config/delayOffset.json``: written byte for byte as the broker's fastjson writes it, read back from strict
JSON or the broker's bare integer keys, refused with the file and the reason when it is anything else."""

from __future__ import annotations

import pytest

from rmqlake.errors import InputError
from rmqlake.formats.store import delay_offsets_json, parse_delay_offsets
from rmqlake.steps.store import read_delay_offsets

# what ScheduleMessageService.persist wrote (RocketMQ 5.3.3, fastjson 1.2.83) for {1: 2, 2: 0, 18: 7} and for {}
BROKER_WRITES = (
    '{\n\t"dataVersion":{\n\t\t"counter":1,\n\t\t"stateVersion":0,\n\t\t"timestamp":1795579752087\n\t},'
    '\n\t"offsetTable":{1:2,2:0,18:7\n\t}\n}'
)
BROKER_WRITES_EMPTY = (
    '{\n\t"dataVersion":{\n\t\t"counter":0,\n\t\t"stateVersion":0,\n\t\t"timestamp":1795579803018\n\t},'
    '\n\t"offsetTable":{}\n}'
)


def test_written_as_the_broker_writes_it():
    assert delay_offsets_json({18: 7, 1: 2, 2: 0}, data_version=1, timestamp=1795579752087) == BROKER_WRITES
    assert delay_offsets_json({}, data_version=0, timestamp=1795579803018) == BROKER_WRITES_EMPTY


@pytest.mark.parametrize(
    ("text", "table"),
    [
        (BROKER_WRITES, {1: 2, 2: 0, 18: 7}),
        (BROKER_WRITES_EMPTY, {}),
        ('{"offsetTable":{"1":5,"3":0}}', {1: 5, 3: 0}),  # strict JSON
        ('{"dataVersion":{"counter":3}}', {}),  # no table: the broker starts every level at 0
        ('{"note":"{1:2, 7:8}","offsetTable":{ 2 : 9 }}', {2: 9}),  # only keys are unquoted, never text in strings
    ],
)
def test_read_from_strict_json_and_from_bare_integer_keys(text, table):
    assert parse_delay_offsets(text) == table


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not JSON: Expecting value"),
        ("[1, 2]", "a JSON list, not an object"),
        ("{offsetTable:{1:2}}", "not JSON: Expecting property name enclosed in double quotes"),
        ("{'offsetTable':{1:2}}", "not JSON"),
        ('{"offsetTable":[1,2]}', "offsetTable is a JSON list, not an object"),
        ('{"offsetTable":{"a":1}}', "offsetTable key 'a' is not a delay level"),
        ('{"offsetTable":{0:1}}', "offsetTable key '0' is not a delay level"),
        ('{"offsetTable":{-1:1}}', "offsetTable key '-1' is not a delay level"),
        ('{"offsetTable":{1:-1}}', "offsetTable level 1: -1 is not a queue offset"),
        ('{"offsetTable":{1:1.5}}', "offsetTable level 1: 1.5 is not a queue offset"),
        ('{"offsetTable":{1:"4"}}', "offsetTable level 1: '4' is not a queue offset"),
        ('{"offsetTable":{1:true}}', "offsetTable level 1: True is not a queue offset"),
        ('{"offsetTable":{1:9223372036854775808}}', "offsetTable level 1: 9223372036854775808 is not"),
        ('{"offsetTable":{1:2}', "not JSON: Expecting ',' delimiter"),
    ],
)
def test_anything_else_is_refused_with_the_reason(text, reason):
    with pytest.raises(ValueError, match="^" + reason.replace("[", r"\[").replace("(", r"\(")):
        parse_delay_offsets(text)


def test_the_store_file_is_read_as_the_broker_reads_it(tmp_path):
    config = tmp_path / "config"
    assert read_delay_offsets(str(tmp_path)) is None  # no config/ at all
    config.mkdir()
    (config / "delayOffset.json").write_text("")  # empty: the broker reads the backup
    (config / "delayOffset.json.bak").write_text('{"offsetTable":{2:4}}')
    assert read_delay_offsets(str(tmp_path)) == {2: 4}
    (config / "delayOffset.json").write_text(BROKER_WRITES)
    assert read_delay_offsets(str(tmp_path)) == {1: 2, 2: 0, 18: 7}
    (config / "delayOffset.json").write_bytes(b'{"offsetTable":{1:\xff}}')
    with pytest.raises(InputError, match=r"delayOffset.json: not UTF-8 text \(invalid start byte at byte 18\)"):
        read_delay_offsets(str(tmp_path))
    (config / "delayOffset.json").write_text('{"offsetTable":{1:-3}}')
    with pytest.raises(InputError) as refused:
        read_delay_offsets(str(tmp_path))
    assert str(refused.value) == (
        f"{config / 'delayOffset.json'}: not a delay offset table: offsetTable level 1: -3 is not a queue offset "
        "(an integer from 0)"
    )
    (config / "delayOffset.json").write_text(" " * (1 << 20) + "{}")
    with pytest.raises(InputError, match="more than any delay offset table needs"):
        read_delay_offsets(str(tmp_path))
