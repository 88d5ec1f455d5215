"""One root for every mistake a user can make (bad config, missing data, corrupt checkpoint, ...).

Entry points report a UserError as one line and exit non-zero; anything else is a bug and keeps its
traceback. Each part derives its own type (ConfigError here, DataError, CheckpointError, ...).
"""
from __future__ import annotations


class UserError(Exception):
    """A mistake in what the user asked for; the message is one line naming the key or file and what is valid."""


class ConfigError(UserError, ValueError):
    """A bad configuration value. (Also a ValueError, for callers that validate values generically.)"""


def report_user_errors(fn, *args, **kwargs):
    """Run an entry point: a UserError becomes one line on stderr and exit status 2; any other
    exception is a bug and propagates with its traceback. Shared by train.py, eval.py, sample.py,
    `python -m data.prepare` and the scripts, so the same mistake reads the same everywhere."""
    import sys

    try:
        return fn(*args, **kwargs)
    except UserError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        raise SystemExit(2) from None
