"""One root for every mistake a user can make (bad config, missing data, corrupt checkpoint, ...).

Entry points report a UserError as one line and exit non-zero; anything else is a bug and keeps its
traceback. Each part derives its own type (ConfigError here, DataError, CheckpointError, ...).
"""
from __future__ import annotations


class UserError(Exception):
    """A mistake in what the user asked for; the message is one line naming the key or file and what is valid."""


class ConfigError(UserError, ValueError):
    """A bad configuration value. (Also a ValueError, for callers that validate values generically.)"""
