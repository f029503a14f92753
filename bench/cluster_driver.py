"""Jobs submitted to a local standalone cluster in client mode, with the driver's peak memory sampled from /proc.

Shared by the driver-memory and scale benchmarks. ``spark-submit --master
spark://... --py-files dist/rmqlake.zip`` in client mode keeps the driver (the
spark-submit JVM and its Python process) apart from the executors, so what the
driver holds can be read from its processes alone. The driver JVM's heap is
capped (``--driver-memory``), so a driver that collected message rows would
fail or swap rather than pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common import REPO

sys.path.insert(0, str(REPO))
from tests.cluster.standalone import standalone_cluster

BIN = Path(sys.executable).parent


def _tree(pid: int) -> dict[int, str]:
    """pid -> command name of ``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            names[int(entry)] = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
    found, todo = {}, [pid]
    while todo:
        current = todo.pop()
        found[current] = names.get(current, "?")
        todo += children.get(current, [])
    return found


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_sampled(command: list[str], env: dict) -> tuple[dict, str]:
    """Run ``command``; (seconds and the peak RSS of its java and python descendants sampled every 0.2 s, stdout)."""
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks = {"java": 0.0, "python": 0.0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            for pid, name in _tree(process.pid).items():
                kind = "java" if name.startswith("java") else "python" if name.startswith("python") else None
                if kind:
                    peaks[kind] = max(peaks[kind], _rss_mb(pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    sampler.start()
    out, err = process.communicate()
    done.set()
    sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{err[-3000:]}")
    figures = {
        "seconds": round(time.monotonic() - started, 1),
        "driver_jvm_mb": round(peaks["java"]),
        "driver_python_mb": round(peaks["python"]),
    }
    return figures, out


def last_json(stdout: str) -> dict:
    """The last JSON object a job printed with ``--json`` (its result)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no JSON result in the job's output: {stdout[-500:]!r}")


def driver_env() -> dict:
    """The environment of spark-submit and of the cluster: this Python on both sides, the repository's conf."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["SPARK_CONF_DIR"] = str(REPO / "conf")
    return env


@contextmanager
def packaged_cluster(root: Path, env: dict) -> Iterator[dict]:
    """``make package`` (the zip the executors import), then a master + 2 one-core workers of 4 GiB.

    The virtualenv's stamp counts as up to date: the jobs run in the Python running this script, which a
    reinstall in the middle of a benchmark would replace under it.
    """
    subprocess.run(["make", "--old-file", ".venv/.installed", "package"], cwd=REPO, check=True, capture_output=True)
    with standalone_cluster(root, env, workers=2, cores=1, memory="4g") as cluster:
        yield cluster


def submit_command(cluster: dict, job: str, options: list[str]) -> list[str]:
    """spark-submit of ``jobs/<job>.py`` in client mode: driver heap 1 GiB, executors 3 GiB, both cores; ingest's
    JVM parser shipped with ``--jars`` (``make bench`` builds it)."""
    jar = REPO / ".jars" / "rmqlake-jvm.jar"
    return [
        str(BIN / "spark-submit"),
        *("--master", cluster["url"], "--driver-memory", "1g", "--executor-memory", "3g"),
        *("--py-files", str(REPO / "dist" / "rmqlake.zip")),
        *(("--jars", str(jar)) if jar.is_file() else ()),
        *("--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.cores.max=2"),
        f"jobs/{job}.py",
        *options,
    ]
