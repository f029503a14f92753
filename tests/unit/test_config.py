"""Configuration: defaults are the broker's; errors name the key, value, what is allowed and the source."""

from __future__ import annotations

import shutil

import pytest

from rmqlake.config import load_settings
from rmqlake.errors import ConfigError
from tests.conftest import CONF


def test_defaults_are_the_brokers():
    settings = load_settings(CONF)
    assert settings.store.commitlog_segment_size == 1073741824
    assert settings.store.max_message_size == 4194304
    assert settings.store.cq_units_per_file == 300000
    assert settings.store.index_slots == 5000000
    assert settings.store.index_max_entries == 20000000
    assert settings.store.message_index_enable is True
    assert settings.retention.file_reserved_hours == 72
    assert settings.retention.delete_when == "04"
    assert (settings.retention.disk_max_used_ratio, settings.retention.disk_clean_forcibly_ratio) == (0.75, 0.85)
    assert settings.retention.disk_warning_ratio == 0.90
    assert settings.retention.max_segments_per_run == 10
    assert settings.retention.disk_other_used_bytes == 0
    assert settings.broker.timezone == "UTC" and settings.broker.cluster_name == "DefaultCluster"
    assert settings.topics["UserProfile"].cleanup_policy == "COMPACTION"


def test_overlay_then_overrides_win():
    settings = load_settings(CONF, env="test", overrides=["store.commitlog_segment_size=4096", "topics.New.queues=2"])
    assert settings.store.commitlog_segment_size == 4096
    assert settings.store.cq_units_per_file == 1000  # from env/test.yaml
    assert settings.topics["New"].queues == 2
    assert settings.queue_count("Unknown") == 4


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("store.commitlog_segment_size=abc", r"store.commitlog_segment_size = 'abc': Input should be a valid integer"),
        ("store.commitlog_segment_size=100", r"greater than or equal to 1024"),
        (
            "store.segment_sizee=1",
            r"store.segment_sizee = 1: unknown key; allowed keys under store: commitlog_segment_size",
        ),
        ("retention.delete_when=25", r"must be hours of day 00-23"),
        ("retention.disk_warning_ratio=1.5", r"less than or equal to 1"),
        ("topics.UserProfile.cleanup_policy=KEEP", r"Input should be 'DELETE' or 'COMPACTION'"),
        ("lake.engine=spark", r"lake.engine = 'spark': Input should be 'delta-rs'"),
        ("broker.timezone=Mars/Base", r"must be an IANA time zone name"),
        ("hosts.store_host=10.0.0.1", r"host must be 'ip:port'"),
        ("nonsense", r"--set expects key.path=value, got 'nonsense'"),
        # values that passed validation and failed later, in the JVM or in every message
        ("spark.driver_memory=xyz", r"spark.driver_memory = 'xyz': must be a JVM memory size: digits and a unit"),
        ("spark.driver_memory=2gb", r"must be a JVM memory size"),  # Spark reads 2gb, -Xmx does not
        ('spark.driver_memory="2048"', r"must be a JVM memory size"),  # bytes for -Xmx, MiB for Spark
        ("spark.driver_memory=256m", r"must be at least 512m"),
        ("broker.cluster_name=Main\x01Cluster", r"must not contain the property separators 0x01 or 0x02"),
        ("broker.cluster_name=Main\x02", r"must not contain the property separators"),
        ("retention.delete_when=\u0660\u0664", r"must be hours of day 00-23"),  # Arabic-Indic "04"
        ("retention.file_reserved_hours=" + "1" * 30, r"less than or equal to 2147483647"),
        ("store.commitlog_segment_size=" + "9" * 5000, r"store.commitlog_segment_size = '9999.*\(5002 characters\)"),
        ("store.commitlog_segment_size=" + "[" * 5000, r"Input should be a valid integer"),
        ("topics=" + "{a: " * 3000, r"topics = '\{a: \{a: "),
        ("lake.root=", r"lake.root = '': must be a folder path"),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(override, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_settings(CONF, overrides=[override])
    if "=" in override:
        assert f"--set {override}" in str(info.value) or "--set expects" in str(info.value)


def test_spark_packages_are_refused(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "env" / "bad.yaml").write_text(
        "spark:\n  conf:\n    spark.jars.packages: io.delta:delta-spark_2.13:4.0.0\n"
    )
    with pytest.raises(ConfigError, match=r"spark\.jars\.packages would make Spark download jars"):
        load_settings(conf, env="bad")


def test_missing_env_lists_the_available_ones():
    with pytest.raises(ConfigError, match=r"--env nope: no file .*available environments: local, test"):
        load_settings(CONF, env="nope")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("topics: [unclosed\n", "while parsing a flow sequence"),
        ("store:\n  commitlog_segment_size: " + "9" * 5000 + "\n", "Exceeds the limit \\(4300 digits\\)"),
        ("spark: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ],
)
def test_broken_yaml_names_the_file_and_the_problem(tmp_path, text, problem):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "env" / "bad.yaml").write_text(text)
    with pytest.raises(
        ConfigError, match=f"configuration file {conf / 'env' / 'bad.yaml'} is not valid YAML: .*{problem}"
    ):
        load_settings(conf, env="bad")


def test_broken_yaml_names_the_file(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "topics.yaml").write_text("topics: [unclosed\n")
    with pytest.raises(ConfigError, match=f"configuration file {conf / 'topics.yaml'} is not valid YAML"):
        load_settings(conf)


def test_a_config_file_that_is_not_utf8_is_named(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "env" / "latin.yaml").write_bytes(b"broker:\n  cluster_name: Caf\xe9\n")
    with pytest.raises(
        ConfigError, match=f"configuration file {conf / 'env' / 'latin.yaml'} is not UTF-8 text \\(byte 27\\)"
    ):
        load_settings(conf, env="latin")


def test_spark_conf_keys_are_passed_to_the_session_as_given():
    from rmqlake.session import session_conf

    settings = load_settings(
        CONF,
        overrides=[
            "spark.conf.spark.sql.shuffle.partitions=3",  # the dotted Spark key is one key, the number a string
            "spark.conf.spark.sql.adaptive.enabled=false",
            "spark.conf.spark.sql.files.maxPartitionBytes=64m",
            "spark.conf.spark.memory.fraction=0.5",
        ],
    )
    assert settings.spark.conf == {
        "spark.sql.shuffle.partitions": "3",
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.files.maxPartitionBytes": "64m",
        "spark.memory.fraction": "0.5",
    }
    conf = session_conf(settings.spark)
    assert conf["spark.sql.shuffle.partitions"] == "3"  # wins over spark.shuffle_partitions
    assert conf["spark.sql.adaptive.enabled"] == "false" and conf["spark.memory.fraction"] == "0.5"
    assert session_conf(load_settings(CONF).spark)["spark.sql.shuffle.partitions"] == "4"


def test_python_workers_talk_over_a_unix_socket_unless_the_user_says_otherwise():
    from rmqlake.session import session_conf

    key = "spark.python.unix.domain.socket.enabled"
    assert session_conf(load_settings(CONF).spark)[key] == "true"
    assert session_conf(load_settings(CONF, overrides=[f"spark.conf.{key}=false"]).spark)[key] == "false"


def test_rmqlakes_own_sql_settings_win_over_spark_conf():
    from rmqlake.session import REQUIRED_SQL_CONF, session_conf

    settings = load_settings(CONF, overrides=["spark.conf.spark.sql.session.timeZone=Asia/Shanghai"])
    assert session_conf(settings.spark)["spark.sql.session.timeZone"] == REQUIRED_SQL_CONF["spark.sql.session.timeZone"]


@pytest.mark.parametrize(
    ("override", "kind"), [("[1, 2]", "list"), ("{a: 1}", "dict"), ("null", "NoneType")], ids=["list", "map", "null"]
)
def test_a_spark_conf_value_that_is_not_a_scalar_is_a_config_error(override, kind):
    with pytest.raises(ConfigError) as info:
        load_settings(CONF, overrides=[f"spark.conf.spark.sql.shuffle.partitions={override}"])
    message = str(info.value)
    assert "spark.conf.spark.sql.shuffle.partitions" in message
    assert f"a Spark setting is a string, a number or a bool, not a {kind}" in message
    assert f"(from --set spark.conf.spark.sql.shuffle.partitions={override})" in message
