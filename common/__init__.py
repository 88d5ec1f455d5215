"""What every part of nanonorm shares: the user-error type and the component registry."""
from .errors import ConfigError, UserError
from .registry import Registry

__all__ = ["ConfigError", "UserError", "Registry"]
