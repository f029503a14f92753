"""The errors rmqlake raises on purpose. The CLI maps them to exit codes.

``ConfigError`` and ``UsageError`` exit 2, ``InputError``, ``CommitConflictError``, ``RefusedError``
and ``CheckFailedError`` exit 1. Each message names the file, line, key or
setting at fault and says what was found against what was expected.
"""

from __future__ import annotations


class RmqlakeError(Exception):
    """Base of every error rmqlake raises deliberately."""

    exit_code = 1


class ConfigError(RmqlakeError):
    """A configuration file or ``--set`` override is invalid; nothing was written."""

    exit_code = 2


class UsageError(RmqlakeError):
    """A command-line argument is invalid (bad timestamp, missing path, ...)."""

    exit_code = 2


class InputError(RmqlakeError):
    """Input files cannot be used at all (none found, unreadable)."""


class CommitConflictError(RmqlakeError):
    """Another run committed to the lake first; this run's work was not committed."""


class CheckFailedError(RmqlakeError):
    """A data-quality or consistency check failed."""


class LakeStateError(RmqlakeError):
    """The lake refuses the operation in its current state (e.g. disk full)."""


class RefusedError(RmqlakeError):
    """The lake's state forbids the work (e.g. the disk-full flag for ingest); nothing was written."""
