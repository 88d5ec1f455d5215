"""nanonorm data: tokenizers, shard preparation and the training/validation loaders."""
from .config import DataConfig, DataError
from .loader import TrainLoader, ValLoader
from .tokenizer import Tokenizer, get_tokenizer, register_tokenizer
from .verify import check_data_dir

__all__ = ["get_tokenizer", "prepare_dataset", "TrainLoader", "ValLoader", "Tokenizer", "register_tokenizer",
           "DataConfig", "DataError", "check_data_dir"]


def prepare_dataset(cfg, **kwargs):
    """See data.prepare.prepare_dataset (imported lazily so `python -m data.prepare` runs cleanly)."""
    from .prepare import prepare_dataset as _prepare
    return _prepare(cfg, **kwargs)
