"""The command line explains itself: help with a description, examples and option help for every subcommand;
--version; global options before or after the subcommand; tables flattened, aligned and wrapped."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re

import pytest

from rmqlake import cli
from rmqlake.report import MAX_CELL, render_table
from tests.conftest import CONF


def subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every (path, parser) below ``parser``, found from the parser itself: a new subcommand is listed too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield (*path, name), child
                yield from subcommands(child, (*path, name))


PARSER = cli.build_parser()
ALL = list(subcommands(PARSER))


def test_the_walk_finds_nested_subcommands():
    names = {" ".join(path) for path, _ in ALL}
    assert {"ingest", "pipeline run", "query key", "query msgid", "status"} <= names


@pytest.mark.parametrize(("path", "parser"), ALL, ids=[" ".join(p) for p, _ in ALL])
def test_every_subcommand_has_a_description_examples_and_option_help(path, parser):
    text = parser.format_help()
    assert parser.description and parser.description.split()[0] in text
    examples = text.split("examples:\n", 1)
    assert len(examples) == 2, f"rmqlake {' '.join(path)} --help shows no examples"
    assert f"rmqlake {' '.join(path)}" in examples[1]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        assert action.help and action.help != argparse.SUPPRESS, (path, action.option_strings or action.dest)
        assert action.help.split()[0] in text


def test_help_prints_and_exits_0(capsys):
    assert cli.main(["query", "msgid", "--help"]) == 0
    out = capsys.readouterr().out
    assert "offsetMsgId" in out and "examples:" in out and "--log-level" in out


def test_version_comes_from_the_package_metadata(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"rmqlake {importlib.metadata.version('rmqlake')}"
    assert cli.version() == importlib.metadata.version("rmqlake")


def test_version_falls_back_to_the_module_version(monkeypatch):
    def missing(_name):
        raise importlib.metadata.PackageNotFoundError("rmqlake")

    monkeypatch.setattr(importlib.metadata, "version", missing)
    import rmqlake

    assert cli.version() == rmqlake.__version__


def parse(*argv: str) -> argparse.Namespace:
    return cli.merge_global_options(cli.build_parser().parse_args(list(argv)))


def test_global_options_before_or_after_the_subcommand_are_the_same():
    options = ["--conf", "c", "--env", "e", "--lake", "l", "--set", "a=1", "--json", "--log-level", "DEBUG"]
    before, after = parse(*options, "lag", "--group", "g"), parse("lag", "--group", "g", *options)
    assert vars(before) == vars(after)
    assert (before.conf, before.env, before.lake, before.overrides, before.json, before.log_level) == (
        "c",
        "e",
        "l",
        ["a=1"],
        True,
        "DEBUG",
    )
    nested = parse("--json", "query", "time", "--topic", "T", "--queue", "1", "--at", "0")
    assert nested.json and nested.query_kind == "time"
    assert not any(name.startswith(cli.GLOBAL_BEFORE) for name in vars(nested))


def test_global_option_defaults_and_both_positions_together(monkeypatch):
    monkeypatch.setenv("RMQLAKE_LAKE", "/from/env")
    plain = parse("status")
    assert (plain.conf, plain.lake, plain.overrides, plain.json, plain.log_level) == (
        "conf",
        "/from/env",
        [],
        False,
        "INFO",
    )
    both = parse("--lake", "first", "--set", "a=1", "status", "--lake", "second", "--set", "b=2")
    assert both.lake == "second"  # the one after the subcommand wins
    assert both.overrides == ["a=1", "b=2"]  # --set from both positions, in order


def test_a_global_option_before_the_subcommand_reaches_the_command(tmp_path, capsys):
    missing = tmp_path / "missing"
    assert cli.main(["--lake", str(missing), "--conf", str(CONF), "--env", "test", "status"]) == 2
    assert f"--lake {missing} does not exist" in capsys.readouterr().err


def cells(text: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()]


def test_nested_dicts_become_dotted_columns():
    rows = [{"job": "expire", "disk": {"used": 10, "ratio": {"commitlog": 0.5}}}, {"job": "reput", "disk": {}}]
    text = render_table(rows, width=200)
    header = cells(text)[0]
    assert header == ["job", "disk.used", "disk.ratio.commitlog", "disk"]
    single = render_table([{"store": {"max_offset": 7, "segments": 2}}], width=200)
    assert cells(single) == [["store.max_offset", "7"], ["store.segments", "2"]]


def test_numbers_are_right_aligned_and_text_left_aligned():
    text = render_table([{"topic": "A", "lag": 5}, {"topic": "LongerTopic", "lag": 12345}], width=100)
    lines = text.splitlines()
    header, first, second = lines[0], lines[2], lines[3]
    assert first.index("5") + 1 == second.index("12345") + 5 == header.index("lag") + 3  # right edges line up
    assert first.index("A") == second.index("LongerTopic") == header.index("topic")


def test_long_values_are_shortened_unless_full_and_wrap_to_the_width():
    body = "".join(f"{i:04d}" for i in range(100))  # 400 characters, no spaces
    short = render_table([{"offset": 1, "body": body}, {"offset": 2, "body": "x"}], width=100)
    assert "..." in short and body not in short.replace("\n", "")
    assert max(len(line) for line in short.splitlines()) <= 100
    assert len(max(cells(short)[2], key=len)) <= MAX_CELL
    full = render_table([{"offset": 1, "body": body}, {"offset": 2, "body": "x"}], full=True, width=100)
    assert max(len(line) for line in full.splitlines()) <= 100  # wrapped, not cut
    column = full.splitlines()[0].index("body")
    assert "".join(line[column:].strip() for line in full.splitlines()[2:-1]) == body
    single = render_table([{"body": body}], full=True, width=100)
    assert single.startswith("body") and "".join(line.split()[-1] for line in single.splitlines()) == body


def test_full_reaches_the_table_and_json_is_unchanged(capsys):
    body = "y" * 300
    cli._emit(argparse.Namespace(json=False, full=True), [{"body": body, "n": 1}])
    assert body in capsys.readouterr().out.replace("\n", "").replace(" ", "")
    cli._emit(argparse.Namespace(json=True, full=False), [{"a": {"b": 1}, "body": body}])
    assert capsys.readouterr().out == json.dumps({"a": {"b": 1}, "body": body}) + "\n"
