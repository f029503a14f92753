"""Runs the real JDK (tests/java/JavaOracle.java) as an oracle for HashMap order and String.hashCode."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).parent / "java" / "JavaOracle.java"


def _java_bin(name: str) -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", name)):
        return os.path.join(home, "bin", name)
    return shutil.which(name)


class JavaOracle:
    """One JVM answering many requests (compiled once into ``workdir``)."""

    def __init__(self, workdir: Path):
        javac, java = _java_bin("javac"), _java_bin("java")
        if not javac or not java:
            raise RuntimeError("the JDK (javac, java) is required for the Java oracle tests")
        subprocess.run([javac, "-d", str(workdir), str(SOURCE)], check=True)
        self.process = subprocess.Popen(
            [java, "-cp", str(workdir), "JavaOracle"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def _ask(self, request: str) -> str:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def broker_properties(self, pairs: list[tuple[str, str]]) -> bytes:
        """Bytes of the properties string after ``new HashMap<>(128)`` + ``put`` of each pair in order."""
        body = " ".join(f"{k.encode().hex()}:{v.encode().hex()}" for k, v in pairs)
        return bytes.fromhex(self._ask(f"props {body}".rstrip()))

    def string_hash(self, text: str) -> int:
        return int(self._ask(f"hash {text.encode().hex()}"))

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait(timeout=10)
