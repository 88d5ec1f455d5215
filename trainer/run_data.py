"""A run's data: the prepared data dir (rank 0 prepares it first) and the train and validation loaders."""
from __future__ import annotations

import logging
from pathlib import Path

from common import ConfigError
from runtime import distributed
from data.files import read_json


log = logging.getLogger("nanonorm.train")


def prepare(data_cfg, dist) -> tuple[Path, str]:
    """(the prepared data dir, its tokenizer's name). Rank 0 prepares (downloads/tokenizes, possibly for
    hours) first and checks every shard once; the others wait (on a gloo group with a long timeout) and
    then find it ready. The model was sized for data.tokenizer's vocabulary: a dir of other tokens is an
    error."""
    import data as data_mod

    def prepare_and_check():
        data_dir = Path(data_mod.prepare_dataset(data_cfg))
        if dist.is_main:  # sha256 and token ids of every shard, read once per data dir (recorded)
            tok_name = read_json(data_dir / "meta.json", f"delete {data_dir} to prepare it again")["tokenizer"]
            data_mod.check_data_dir(data_dir, data_mod.get_tokenizer(tok_name).vocab_size, tokenizer=tok_name)
        return data_dir

    data_dir = distributed.main_first(prepare_and_check)
    tokenizer = read_json(data_dir / "meta.json", f"delete {data_dir} to prepare it again")["tokenizer"]
    if tokenizer != data_cfg.tokenizer:
        raise ConfigError(f"data dir {data_dir} holds {tokenizer!r} tokens, not data.tokenizer="
                          f"{data_cfg.tokenizer!r}; prepare it again or use its tokenizer")
    return data_dir, tokenizer


def loaders(data_dir: Path, train_cfg, block_size: int, accum: int, dist):
    """(train loader, validation loader) of this rank. The validation budget is whole sequences: said once."""
    import data as data_mod

    loader = data_mod.TrainLoader(data_dir, train_cfg.micro_batch_size, block_size, grad_accum=accum,
                                  rank=dist.rank, world_size=dist.world_size, seed=train_cfg.seed)
    val = data_mod.ValLoader(data_dir, train_cfg.eval_batch_size or train_cfg.micro_batch_size, block_size,
                             token_budget=train_cfg.eval_tokens, rank=dist.rank, world_size=dist.world_size)
    budget = train_cfg.eval_tokens
    if budget is not None and val.num_tokens != budget and dist.is_main:
        log.warning(f"train.eval_tokens={budget} is scored as {val.num_sequences} whole sequence(s) of "
                    f"{block_size} tokens = {val.num_tokens} tokens"
                    + (" (all the validation split has)" if val.num_sequences < max(1, budget // block_size) else ""))
    return loader, val


def final_loader(data_dir: Path, train_cfg, block_size: int, dist):
    """The final evaluation's validation loader: train.final_eval_tokens spread over the split (null: every
    window), with each target's document."""
    import data as data_mod

    return data_mod.ValLoader(data_dir, train_cfg.eval_batch_size or train_cfg.micro_batch_size, block_size,
                              token_budget=train_cfg.final_eval_tokens, rank=dist.rank, world_size=dist.world_size,
                              docs=True)


def token_bytes(tokenizer: str, device):
    """int64 [vocab] on `device`: the UTF-8 bytes of each id (data.Tokenizer.token_bytes), for bits per byte."""
    import torch

    import data as data_mod

    return torch.from_numpy(data_mod.get_tokenizer(tokenizer).token_bytes()).to(device)
