"""The options rmqlake gives a driver JVM it starts itself: warnings to stderr, Spark's logging quieted, the
class-data archive when it is there and the class path it was made with can be."""

from __future__ import annotations

import logging
import shlex

import pytest

from rmqlake.config import SparkSettings
from rmqlake.session import driver_java_options
from tests.conftest import CONF


@pytest.fixture
def archive(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    path = tmp_path / "the classes.jsa"  # a space: the options are split as a shell would
    path.write_bytes(b"archive")
    return path


def flags(settings: SparkSettings, conf_dir=CONF) -> list[str]:
    return shlex.split(driver_java_options(settings, conf_dir))


def test_the_archive_the_log4j_file_and_stderr_warnings(archive):
    assert flags(SparkSettings(class_archive=str(archive))) == [
        "-Xlog:disable",
        "-Xlog:all=warning:stderr",  # stdout carries --json output
        f"-Dlog4j2.configurationFile={CONF / 'log4j2.properties'}",
        f"-XX:SharedArchiveFile={archive}",
        "-Xshare:auto",  # a stale archive is done without, with a warning
    ]


def test_no_archive_when_the_file_is_not_there_or_the_setting_is_empty(archive, tmp_path):
    for setting in (str(tmp_path / "missing.jsa"), ""):
        options = flags(SparkSettings(class_archive=setting))
        assert not any(o.startswith(("-XX:SharedArchiveFile", "-Xshare")) for o in options), setting
        assert "-Xlog:all=warning:stderr" in options


def test_a_relative_archive_is_found_in_the_working_directory(archive, monkeypatch):
    monkeypatch.chdir(archive.parent)
    assert f"-XX:SharedArchiveFile={archive}" in flags(SparkSettings(class_archive=archive.name))


def test_spark_conf_dir_set_leaves_the_archive_and_the_log4j_file_out_and_says_why(archive, tmp_path, monkeypatch,
                                                                                   caplog):  # fmt: skip
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="rmqlake.session"):
        options = flags(SparkSettings(class_archive=str(archive)))
    assert options == ["-Xlog:disable", "-Xlog:all=warning:stderr"]  # the user's SPARK_CONF_DIR has their log4j
    assert f"spark.class_archive {archive} is not used" in caplog.text and str(tmp_path) in caplog.text


def test_without_a_log4j_file_no_log4j_option(archive, tmp_path):
    for conf_dir in (tmp_path, None):
        options = flags(SparkSettings(class_archive=str(archive)), conf_dir=conf_dir)
        assert not any(o.startswith("-Dlog4j2") for o in options) and f"-XX:SharedArchiveFile={archive}" in options


def test_the_users_extra_java_options_come_last_and_so_win(archive):
    own = "-Xshare:off -Dtheirs='a b'"
    options = flags(SparkSettings(class_archive=str(archive), conf={"spark.driver.extraJavaOptions": own}))
    assert options[-2:] == ["-Xshare:off", "-Dtheirs=a b"] and f"-XX:SharedArchiveFile={archive}" in options
