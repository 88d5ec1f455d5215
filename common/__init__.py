"""What every part of nanonorm shares: the user-error type, the component registry, perplexity."""
from .errors import ConfigError, UserError, report_user_errors
from .metrics import perplexity
from .registry import Registry

__all__ = ["ConfigError", "UserError", "Registry", "perplexity", "report_user_errors"]
