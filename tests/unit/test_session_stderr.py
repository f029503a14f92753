"""``separate_stderr``: only a Python driver that ``spark-submit``'s JVM started gets its stderr moved (the
process-level test in ``tests/e2e/test_expire_processes.py`` runs one)."""

import os
import subprocess
import sys

from rmqlake.session import separate_stderr


def test_stderr_stays_outside_spark_submit(monkeypatch):
    before = os.fstat(2)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert separate_stderr() is False
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)


def test_stderr_stays_under_a_parent_that_is_no_jvm():
    """A Python parent whose stderr is a pipe, as a JVM's would be; the child looks like a spark-submit driver."""
    child = "from rmqlake.session import separate_stderr; print(separate_stderr())"
    parent = (
        "import os, subprocess, sys\n"
        f"env = {{**os.environ, 'PYSPARK_GATEWAY_PORT': '1'}}\n"
        f"sys.exit(subprocess.run([sys.executable, '-c', {child!r}], env=env).returncode)\n"
    )
    done = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "False\n"), done.stderr
