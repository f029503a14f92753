"""Byte rules of a RocketMQ broker store, in pure Python (no Spark, no I/O).

Each module owns one rule set; everything else in rmqlake calls these
functions instead of re-deriving a byte layout. The rules follow
``shared/spec/rocketmq-store-format.md`` (section numbers are cited in the
module docstrings) and are tested against ``shared/spec/vectors.json``.
"""
