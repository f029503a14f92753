"""Runs the Java harness classes of tests/interop/java against the pinned RocketMQ jars and reads their JSON answer.

``make jars`` fetches RocketMQ (tests/interop/pom.xml) into ``.jars/rocketmq/`` and compiles
``tests/interop/java/*.java`` into ``.jars/interop-classes/``. Nothing is downloaded here: when
the jars are missing the tests fail and say to run ``make jars``.

A harness main class prints its answer as one JSON object on the last line of stdout that starts
with ``{``; RocketMQ's own logging goes to files under the JVM's ``user.home`` (a temp folder).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from rmqlake.formats.hosts import parse_host
from rmqlake.formats.record import encode_record
from rmqlake.store.rows import record_from_row

REPO = Path(__file__).resolve().parents[2]
JARS = REPO / ".jars"
ROCKETMQ_JARS = JARS / "rocketmq"
# RMQLAKE_INTEROP_CLASSES: another folder of compiled harness classes (a harness being changed, before `make jars`)
CLASSES = Path(os.environ.get("RMQLAKE_INTEROP_CLASSES") or JARS / "interop-classes")
ROCKETMQ_VERSION = "5.3.3"


class HarnessError(RuntimeError):
    """The harness JVM failed or printed no JSON answer (its output is in the message)."""


def java_bin() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise HarnessError("no java found: set JAVA_HOME to an OpenJDK 17")
    return found


def classpath(main_class: str | None = None) -> str:
    """``.jars/interop-classes`` + ``.jars/rocketmq/*``; fails naming ``make jars`` when they are missing."""
    store_jar = ROCKETMQ_JARS / f"rocketmq-store-{ROCKETMQ_VERSION}.jar"
    if not store_jar.exists():
        raise HarnessError(f"{store_jar} is missing: run `make jars` (fetches RocketMQ {ROCKETMQ_VERSION} with Maven)")
    if main_class is not None and not (CLASSES / f"{main_class.replace('.', '/')}.class").exists():
        raise HarnessError(
            f"{CLASSES}/{main_class}.class is missing: run `make jars` (compiles tests/interop/java/*.java)"
        )
    return os.pathsep.join([str(CLASSES), str(ROCKETMQ_JARS / "*")])


def run_java(
    main_class: str,
    *args: str,
    timeout: float = 300,
    jvm_options: tuple[str, ...] = (),
    home: Path | None = None,
) -> dict:
    """Run ``main_class`` with ``args`` in a fresh JVM (UTC, small heap) and return its JSON answer.

    Args:
        main_class: a class compiled from tests/interop/java (default package).
        args: its command line.
        timeout: seconds before the JVM is killed and :class:`HarnessError` raised.
        jvm_options: extra ``-D``/``-X`` options.
        home: the JVM's ``user.home`` (RocketMQ writes its logs under it); a temp folder by default.

    Raises:
        HarnessError: the jars are missing, the JVM exited non-zero, or printed no JSON object.
    """
    cp = classpath(main_class)
    owned = home is None
    home = Path(tempfile.mkdtemp(prefix="rmq-home-")) if home is None else home
    command = [
        java_bin(),
        "-Xmx512m",
        "-XX:+UseSerialGC",
        "-Duser.timezone=UTC",
        f"-Duser.home={home}",
        "-Drocketmq.client.logUseSlf4j=false",
        *jvm_options,
        "-cp",
        cp,
        main_class,
        *args,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"{main_class} {' '.join(args)}: no answer within {timeout} s\n{exc.stderr or ''}") from exc
    finally:
        if owned:
            shutil.rmtree(home, ignore_errors=True)
    if done.returncode != 0:
        raise HarnessError(f"{main_class} {' '.join(args)} exited {done.returncode}:\n{done.stderr[-8000:]}")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise HarnessError(f"{main_class} printed no JSON object:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")


def message_fields(row: dict, *, raw: bool = True) -> dict:
    """A commitlog row as the harness prints a message MessageDecoder read (hosts as their stored field, hex)."""
    out = {
        "msgId": row["msg_id"],
        "topic": row["topic"],
        "queueId": row["queue_id"],
        "flag": row["flag"],
        "queueOffset": row["queue_offset"],
        "commitLogOffset": row["physical_offset"],
        "storeSize": row["total_size"],
        "sysFlag": row["sys_flag"],
        "bodyCRC": row["body_crc"],
        "bornTimestamp": row["born_timestamp"],
        "bornHost": parse_host(row["born_host"]).encode().hex(),
        "storeTimestamp": row["store_timestamp"],
        "storeHost": parse_host(row["store_host"]).encode().hex(),
        "reconsumeTimes": row["reconsume_times"],
        "preparedTransactionOffset": row["prepared_transaction_offset"],
        "body": base64.b64encode(row["body"]).decode() if row["body"] else None,  # the decoder leaves it null
        "properties": dict(sorted(row["properties"])),
    }
    if raw:
        out["raw"] = base64.b64encode(encode_record(record_from_row(row))).decode()
    return out
