"""The run name's tail: the command line's overrides that change what is trained, beyond the norm, model,
arch, optimizer, data and seed the name already has. Without it `python train.py model.attn_gate=headwise`
after the quick start lands in the quick start's run dir and is refused.

    run_name: ${norm.name}-${model.name}-${model.arch}-${optim.name}-${first:${data.name},${data.source}}-s...
              ...${train.seed}${run_tag:}      (configs/config.yaml)
"""
from __future__ import annotations

import hashlib
import re

# What is trained: every key of these groups, and these train keys. How long, where, how often to log
# or save, and how to resume are left out, so `train.max_steps=2000 train.resume=auto` continues the run.
NAMED_PREFIXES = ("model.", "norm.", "optim.", "data.")
NAMED_TRAIN_KEYS = ("train.batch_tokens", "train.precision", "train.overfit_batch", "train.inject_nan_at",
                    "train.inject_nan_steps")
NAMED_GROUPS = ("experiment",)  # a group choice the name does not otherwise show
READABLE = re.compile(r"^[A-Za-z0-9_.+-]+$")
MAX_READABLE = 48


def _split(override: str) -> tuple[str, str] | None:
    key, sep, value = override.lstrip("+~").partition("=")
    return (key.strip(), value.strip()) if sep else None


def named_overrides(overrides: list[str]) -> list[tuple[str, str]]:
    """(key, value) of the overrides that change what is trained, sorted by key; the last one of a key wins."""
    from data.config import content_keys

    data_keys = {f"data.{k}" for k in content_keys()}
    kept = {}
    for o in overrides:
        kv = _split(o)
        if kv is None:
            continue
        k, v = kv
        if k.startswith("data."):
            if k in data_keys:
                kept[k] = v
        elif k.startswith(NAMED_PREFIXES) or k in NAMED_TRAIN_KEYS or k in NAMED_GROUPS:
            if k not in ("model.name", "norm.name", "optim.name", "data.name", "model.arch"):  # in the name
                kept[k] = v
    return sorted(kept.items())


def run_tag(overrides: list[str]) -> str:
    """"" without such overrides; else "-" and either the overrides as `key=value` (the key's last part)
    joined by "," when short and plain, or "h" and 8 hex digits of their hash."""
    named = named_overrides(overrides)
    if not named:
        return ""
    shorts = [(k.rsplit(".", 1)[-1], v) for k, v in named]
    readable = ",".join(f"{k}={v}" for k, v in shorts)
    plain = all(READABLE.match(v) for _, v in shorts) and len({k for k, _ in shorts}) == len(shorts)
    if plain and len(readable) <= MAX_READABLE:
        return "-" + readable
    full = ",".join(f"{k}={v}" for k, v in named)
    return "-h" + hashlib.sha1(full.encode()).hexdigest()[:8]


def _resolve() -> str:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return ""
    return run_tag(list(HydraConfig.get().overrides.task))


def register_resolver() -> None:
    """`${run_tag:}` and `${first:a,b}` (the first of its arguments that is not null: the corpus's name,
    else its source's, as DataConfig names it) for configs/config.yaml (idempotent)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("run_tag"):
        OmegaConf.register_new_resolver("run_tag", _resolve)
    if not OmegaConf.has_resolver("first"):
        OmegaConf.register_new_resolver("first", lambda *args: next((a for a in args if a is not None), None))
