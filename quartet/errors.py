"""Errors a user can act on. Their message is one line naming the key and the allowed values."""
from __future__ import annotations


class QuartetError(Exception):
    """Base of the project's user-facing errors (the CLI prints the message, exits non-zero)."""


class ConfigError(QuartetError, ValueError):
    """A config key has a bad value: the message names the key and what is allowed."""


class DataError(QuartetError):
    """Missing, corrupt or incompatible data shards / manifests."""


class NonFiniteError(QuartetError):
    """A loss or gradient went NaN/Inf; the message names the step and the first offending module."""
