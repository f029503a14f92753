"""A Spark standalone cluster on 127.0.0.1 from the pyspark installation: one master, N workers, each its own
JVM, log file and work directory. Used by the cluster tests and the driver-memory benchmark."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SPARK_HOME = Path(__import__("pyspark").__file__).parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _spark_class(*args: str, log: Path, env: dict) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: stopped with everything it started
        )


def master_state(ui: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as response:
        return json.load(response)


@contextmanager
def standalone_cluster(
    root: Path, env: dict, *, workers: int = 2, cores: int = 1, memory: str = "2g", timeout: float = 90
) -> Iterator[dict]:
    """Start the cluster, wait for every worker, yield ``{"url", "ui", "root"}``; always stop it."""
    root.mkdir(parents=True, exist_ok=True)
    env = {**env, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    port, ui = free_port(), free_port()
    processes = [
        _spark_class(
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)),
            log=root / "master.log",
            env=env,
        )
    ]
    url = f"spark://127.0.0.1:{port}"
    try:
        for number in range(1, workers + 1):
            work = root / f"worker-{number}"
            work.mkdir(exist_ok=True)
            processes.append(
                _spark_class(
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    *("--host", "127.0.0.1", "--cores", str(cores), "--memory", memory, "--work-dir", str(work)),
                    *("--webui-port", str(free_port())),
                    log=root / f"worker-{number}.log",
                    env=env,
                )
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                if master_state(ui).get("aliveworkers", 0) >= workers:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not come up with {workers} workers; logs in {root}")
            time.sleep(1)
        yield {"url": url, "ui": ui, "root": root}
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
