"""What every part of nanonorm shares: the user-error type and the component registry."""
from .errors import ConfigError, UserError, report_user_errors
from .registry import Registry

__all__ = ["ConfigError", "UserError", "Registry", "report_user_errors"]
