"""Topic name rules: the client's TopicValidator and the broker's pre-put check."""

from __future__ import annotations

import re

VALID_TOPIC = re.compile(r"[%|a-zA-Z0-9_-]+")  # used with fullmatch: "$" would also match before a final newline
TOPIC_MAX_LENGTH = 127
RETRY_TOPIC_PREFIX = "%RETRY%"
RETRY_TOPIC_MAX_BYTES = 255


def topic_error(topic: object) -> str | None:
    """Why ``topic`` cannot be stored, or ``None`` when it can.

    Every character must be one of ``[%|a-zA-Z0-9_-]`` (so a trailing newline
    is refused too); the UTF-8 length must be at most 127 bytes, except for
    ``%RETRY%`` topics, which may reach 255 (and are then stored with the V2
    magic).
    """
    if not isinstance(topic, str) or not topic.strip():
        return "topic is blank"
    if not VALID_TOPIC.fullmatch(topic):
        return f"topic {topic!r} has characters outside [%|a-zA-Z0-9_-]"
    length = len(topic.encode("utf-8"))
    if topic.startswith(RETRY_TOPIC_PREFIX):
        if length > RETRY_TOPIC_MAX_BYTES:
            return f"retry topic is {length} bytes long, the maximum is {RETRY_TOPIC_MAX_BYTES}"
    elif length > TOPIC_MAX_LENGTH:
        return f"topic is {length} bytes long, the maximum is {TOPIC_MAX_LENGTH} (only %RETRY% topics may be longer)"
    return None
