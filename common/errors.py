"""One root for every mistake a user can make (bad config, missing data, corrupt checkpoint, ...).

Entry points report a UserError as one line and exit non-zero; anything else is a bug and keeps its
traceback. Each part derives its own type (ConfigError here, DataError, CheckpointError, ...).
"""
from __future__ import annotations


class UserError(Exception):
    """A mistake in what the user asked for; the message is one line naming the key or file and what is valid."""


class ConfigError(UserError, ValueError):
    """A bad configuration value. (Also a ValueError, for callers that validate values generically.)"""


def say_line(line: str) -> None:
    """Write one line to stderr in a single write. Python's stderr writes through, so print() sends the text
    and its newline as two writes, and another rank sharing the terminal or pipe can land between them."""
    import sys

    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def disk_full(e: BaseException) -> bool:
    """A write that failed because the file system is full (or over quota). torch.save's zip writer says so
    only as a short write: 'unexpected pos N vs M'."""
    import errno

    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(e, RuntimeError) and "unexpected pos" in str(e)


def environment_message(e: BaseException) -> "str | None":
    """One line for a file-system fault that is the machine's, not the code's (full disk, read-only or
    forbidden location, a file where a directory belongs); None for anything else (a bug: keep its
    traceback)."""
    import errno

    if not isinstance(e, OSError) or e.errno is None:
        return None
    where = e.filename if e.filename is not None else "a file"
    if disk_full(e):
        return f"cannot write {where}: the disk is full (or over quota); free space or choose another location"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {where}: {e.strerror}; choose a writable location"
    if e.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
        return f"cannot use {where}: {e.strerror} (a file where a directory belongs, or the reverse); move it away " \
               "or choose another location"
    return None


# what an entry point keeps when Ctrl-C stops it, said in its one line (set_interrupt_note)
_INTERRUPT_NOTE = ["nothing was written"]


def set_interrupt_note(note: str) -> None:
    """What this entry point keeps if Ctrl-C stops it, and how to resume: the end of report_user_errors' line."""
    _INTERRUPT_NOTE[0] = note


def interpolation_line(e: BaseException) -> str | None:
    """One line for an OmegaConf error (an interpolation that cannot resolve: ${nope}, ${oc.env:UNSET}), naming
    the command-line arguments that carry one; None for any other exception."""
    import sys

    if not type(e).__module__.startswith("omegaconf"):
        return None
    given = [a for a in sys.argv[1:] if "${" in a]
    where = f"in {', '.join(given)}" if given else f"at {getattr(e, 'full_key', None) or 'the config'}"
    msg = (str(getattr(e, "msg", None) or e).strip().splitlines() or [""])[0]  # not its full_key lines
    return f"bad interpolation {where}: {msg}"


def hydra_line(e: BaseException) -> str | None:
    """One line for a Hydra composition error raised outside train.py's own handler (a script composing a
    config: an unknown norm= or data= name): Hydra's first line and the options it lists; None for others."""
    if not type(e).__module__.startswith("hydra"):
        return None
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    opts, taking = [], False
    for ln in lines[1:]:
        if ln.startswith("Available options"):
            taking = True
        elif ln.startswith("Config search path"):
            break
        elif taking:
            opts.append(ln)
    return lines[0] + (f" (valid: {', '.join(opts)})" if opts else "")


def report_user_errors(fn, *args, **kwargs):
    """Run an entry point: a UserError, or a file-system fault of the machine (environment_message), becomes
    one line on stderr and exit status 2; any other exception is a bug and propagates with its traceback.
    Shared by train.py, eval.py, sample.py, `python -m data.prepare` and the scripts, so the same mistake
    reads the same everywhere."""

    try:
        return fn(*args, **kwargs)
    except KeyboardInterrupt:  # Ctrl-C: what was kept, not where Python was
        say_line(f"interrupted (Ctrl-C): {_INTERRUPT_NOTE[0]}")
        raise SystemExit(130) from None
    except UserError as e:
        say_line(f"error: {' '.join(str(e).split())}")
        raise SystemExit(2) from None
    except OSError as e:
        msg = environment_message(e) or hydra_line(e)   # Hydra's MissingConfigException is an IOError too
        if msg is None:
            raise
        say_line(f"error: {msg}")
        raise SystemExit(2) from None
    except Exception as e:
        line = interpolation_line(e) or hydra_line(e)
        if line is None:
            raise
        say_line(f"error: {line}")
        raise SystemExit(2) from None
