"""DataError: a bad data config or input file (one line naming the key or file and what is valid)."""
from common import UserError


class DataError(UserError, ValueError):
    """Bad data config or input; the message is one line naming the key/file and what is valid."""
