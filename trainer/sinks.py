"""Where records go: metrics.jsonl (always), wandb (rank 0, offline by default), a recorder for tests.

A record is a flat dict with "kind", "step", "tokens" and the fields listed in the README's "Monitoring" section.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from data.files import atomic_write


def _clean(v):
    # JSON has no NaN/inf; write them as null so every line parses with any reader.
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class Sink:
    def log(self, record: dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class JsonlSink(Sink):
    """One JSON object per line; flushed per record (records only arrive at log/eval/stats steps)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.f = open(self.path, "a", buffering=1)

    def log(self, record: dict) -> None:
        self.f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")

    def close(self) -> None:
        self.f.close()


def truncate_jsonl(path: Path, step: int) -> None:
    """On resume from `step`: drop records past it (logged after that checkpoint) and old summaries."""
    path = Path(path)
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if r.get("kind") != "summary" and r.get("step", 0) <= step:
            keep.append(line)
    atomic_write(path, "".join(line + "\n" for line in keep))


def wandb_row(record: dict) -> Optional[dict]:
    """A record as wandb keys: '<kind>/<field>' (spikes: 'spike/<metric>' = value, 'spike/<metric>_z')."""
    kind = record["kind"]
    if kind == "summary":
        return None  # goes to run.summary
    if kind == "spike":
        return {f"spike/{record['metric']}": record["value"], f"spike/{record['metric']}_z": record["z"],
                "tokens": record["tokens"]}
    row = {f"{kind}/{k}": v for k, v in record.items() if k not in ("kind", "step", "tokens") and v is not None}
    row["tokens"] = record["tokens"]
    return row


class WandbSink(Sink):
    """wandb on rank 0. mode offline (default) never prompts or talks to the network."""

    def __init__(self, wcfg, run_name: str, run_dir: Path, config: dict, run_id: Optional[str]):
        import wandb  # slow import: only when used

        self.wandb = wandb
        self.run = wandb.init(mode=wcfg.mode, project=wcfg.project, entity=wcfg.entity, group=wcfg.group,
                              name=wcfg.name or run_name, tags=list(wcfg.tags), config=config, dir=str(run_dir),
                              id=run_id, resume="allow" if run_id else None,
                              settings=wandb.Settings(console="off", silent=True))
        self.run_id = self.run.id if self.run is not None else None
        self.url = getattr(self.run, "url", None) if wcfg.mode == "online" else None

    def log(self, record: dict) -> None:
        if record["kind"] == "summary":
            for k, v in record.items():
                if k != "kind":
                    self.run.summary[k] = v
            return
        self.run.log(wandb_row(record), step=record["step"])

    def close(self) -> None:
        self.run.finish()
