"""The one error type of a config that cannot run."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot run: the message names the key and the fix."""
