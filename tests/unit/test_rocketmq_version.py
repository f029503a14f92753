"""The RocketMQ release rmqlake names as its judge is the one the interop tests run (tests/interop/pom.xml)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from rmqlake.formats.store import ROCKETMQ_VERIFIED_VERSION
from tests.interop import harness

POM = Path(__file__).resolve().parents[1] / "interop" / "pom.xml"


def test_the_verified_version_is_the_one_the_interop_pom_pins():
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    pinned = ET.parse(POM).getroot().find("m:properties/m:rocketmq.version", namespace)
    assert pinned is not None and pinned.text == ROCKETMQ_VERIFIED_VERSION
    assert harness.ROCKETMQ_VERSION == ROCKETMQ_VERIFIED_VERSION  # the jars the harness looks for
