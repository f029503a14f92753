"""Strict JSON from files users did not write: every bad text is a ``JsonTextError``, never a crash.

``json.loads`` alone accepts ``NaN`` and ``Infinity``, raises a plain
``ValueError`` for an integer of more digits than Python converts (4,300 by
default), and ``RecursionError`` for deep nesting (how deep depends on the
caller's stack). ``loads_strict`` refuses all three with a reason, and its
nesting limit is a fixed number, so a text gets the same answer wherever it
is parsed.
"""

from __future__ import annotations

import json
import re
import sys
from itertools import accumulate
from typing import Any

MAX_DEPTH = 100  # arrays and objects inside each other
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JsonTextError(ValueError):
    """Why a text is not strict JSON.

    ``position`` is the character index where the decoder stopped, when it
    knows; ``path`` the keys and indexes leading to the offending value, when
    it is one value (an integer too long to read).
    """

    def __init__(self, reason: str, *, position: int | None = None, path: tuple[str | int, ...] = ()):
        super().__init__(reason)
        self.reason = reason
        self.position = position
        self.path = path

    def where(self, text: str) -> tuple[int, int] | None:
        """(line, column), both 1-based, of ``position`` in ``text``; ``None`` when unknown."""
        return None if self.position is None else line_and_column(text, self.position)


def line_and_column(text: str, position: int) -> tuple[int, int]:
    """(line, column), both 1-based, of the character index ``position`` in ``text``."""
    line = text.count("\n", 0, position) + 1
    return line, position - (text.rfind("\n", 0, position) + 1) + 1


class _LongInteger(str):
    """An integer literal too long for ``int()``: kept as its text so that its place can be named."""


def loads_strict(text: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` for untrusted text.

    Raises:
        JsonTextError: malformed JSON (with its position), ``NaN``/``Infinity``,
            nesting deeper than ``max_depth``, or an integer too long to convert
            (``path`` says where it is).
    """
    if text.count("[") + text.count("{") > max_depth and nesting_depth(text) > max_depth:
        raise JsonTextError(f"JSON nested too deeply: more than {max_depth} levels of arrays and objects")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise JsonTextError(exc.msg, position=exc.pos) from None
    except RecursionError:  # only when the caller's own stack is already deep
        raise JsonTextError(f"JSON nested too deeply: more than {max_depth} levels of arrays and objects") from None
    except JsonTextError:
        raise
    except ValueError:  # int() refused a literal's length; parse again keeping long literals as text
        try:
            document = json.loads(text, parse_constant=_refuse_constant, parse_int=_integer)
        except json.JSONDecodeError as exc:  # malformed after the long literal
            raise JsonTextError(exc.msg, position=exc.pos) from None
        found = _find_long_integer(document, ())
        if found is None:
            raise
        path, literal = found
        digits = len(literal.lstrip("-"))
        raise JsonTextError(
            f"an integer of {digits} digits, more than the {sys.get_int_max_str_digits()} that can be read", path=path
        ) from None


def nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in ``text`` (brackets inside strings do not count)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _refuse_constant(name: str) -> Any:
    raise JsonTextError(f"{name} is not JSON (JSON numbers are finite)")


def _integer(literal: str) -> int | str:
    limit = sys.get_int_max_str_digits()
    if limit and len(literal.lstrip("-")) > limit:
        return _LongInteger(literal)
    return int(literal)


def _find_long_integer(value: Any, path: tuple) -> tuple[tuple, str] | None:
    if isinstance(value, _LongInteger):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        found = _find_long_integer(inner, (*path, key))
        if found is not None:
            return found
    return None
