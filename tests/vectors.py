"""Access to the spec's test vectors (made by running RocketMQ's own classes).

``tests/data/vectors.json`` is a copy of ``shared/spec/vectors.json``;
``test_vectors_copy_matches_the_spec`` fails when the two drift apart.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

VECTORS_COPY = Path(__file__).parent / "data" / "vectors.json"
SPEC_VECTORS = Path(__file__).resolve().parents[2] / "shared" / "spec" / "vectors.json"


@lru_cache(maxsize=1)
def vectors() -> dict:
    return json.loads(VECTORS_COPY.read_text(encoding="utf-8"))


def section(name: str):
    return vectors()[name]
