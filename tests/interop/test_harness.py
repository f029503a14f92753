"""The harness runner fails, never skips, when the RocketMQ jars or the compiled harness are missing."""

from __future__ import annotations

import pytest

from tests.interop import harness

pytestmark = pytest.mark.interop


def test_missing_jars_fail_naming_make_jars(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "ROCKETMQ_JARS", tmp_path / "rocketmq")
    with pytest.raises(harness.HarnessError, match=r"rocketmq-store-5\.3\.3\.jar is missing: run `make jars`"):
        harness.run_java("StoreHarness", "read", "request.json")


def test_a_missing_harness_class_fails_naming_make_jars(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "CLASSES", tmp_path / "interop-classes")
    with pytest.raises(harness.HarnessError, match=r"StoreHarness\.class is missing: run `make jars`"):
        harness.classpath("StoreHarness")
