"""DataError: a bad data config or input file (one line naming the key or file and what is valid)."""
from common import UserError


class DataError(UserError, ValueError):
    """Bad data config or input; the message is one line naming the key/file and what is valid."""


class HubUnreachable(DataError):
    """The Hugging Face hub could not be reached (no network, or HF_HUB_OFFLINE without a cached copy).
    Not bad input: what was already prepared is kept, to resume when the hub is back."""
    resumable = True


class DiskFull(DataError):
    """The disk filled up while preparing. Not bad input: the finished shards and the progress checkpoint
    are kept, to resume once there is space."""
    resumable = True
