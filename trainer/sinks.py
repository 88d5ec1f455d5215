"""Where records go: metrics.jsonl (always), the console (`logging.console`), wandb (rank 0, offline by default).

A record is a flat dict with "kind", "step", "tokens" and the fields listed in docs/training.md, "Monitoring".
"""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Optional

from common import perplexity
from data.files import atomic_write

log = logging.getLogger("nanonorm.train")


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
        self.mode = wcfg.mode
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


def hms(seconds: float) -> str:
    m, sec = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


class ConsoleSink(Sink):
    """The run on the console: one line per train and eval record (with the time left at this process's
    pace so far), and at the summary where everything is and what to run next."""

    def __init__(self, run_dir: Path, max_steps: int, batch_tokens: int, step0: int, resumed: bool,
                 wandb: Optional["WandbSink"] = None):
        self.run_dir, self.max_steps, self.batch_tokens = Path(run_dir), max_steps, batch_tokens
        self.step0, self.resumed, self.wandb = step0, resumed, wandb
        self.t0 = time.perf_counter()

    def log(self, r: dict) -> None:
        if r["kind"] == "train":
            log.info(f"step {r['step']}/{self.max_steps} | loss {r['loss']:.4f} | lr {r['lr']:.3g} | grad norm "
                     f"{r['grad_norm']:.3g}"
                     + (f" | {r['tokens_per_s']:,.0f} tok/s | {1000 * r['step_time']:.0f} ms/step"
                        if r["tokens_per_s"] is not None else "")
                     + (f" | mfu {100 * r['mfu']:.1f}% (6N+12LdT), {100 * r['mfu_causal']:.1f}% (causal 6N+6LdT)"
                        if r["mfu"] is not None else "")
                     + (f" | compile {r['compile_s']:.1f}s (first step, not in tok/s)" if "compile_s" in r else "")
                     + (f" | skipped {r['skipped_steps']}" if r["skipped_steps"] else "") + self._eta(r["step"]))
        elif r["kind"] == "eval":
            log.info(f"step {r['step']} | val loss {r['val_loss']:.4f} | val bpb {r['val_bpb']:.4f} "
                     f"| val ppl {r['val_ppl']:.2f}")
        elif r["kind"] == "final_eval":
            se = f" ± {r['se_bpb']:.4f} (s.e. over {r['val_docs']} documents)" if r.get("se_bpb") is not None else ""
            scope = "the whole val split" if r["whole_split"] else "a sample spread over the val split"
            log.info(f"final eval on {scope} ({r['val_tokens']:,} tokens, {r['val_bytes']:,} bytes): "
                     f"val loss {r['val_loss']:.4f} | val bpb {r['val_bpb']:.4f}{se}")
        elif r["kind"] == "summary":
            for line in self._summary(r):
                log.info(line)

    def _eta(self, step: int) -> str:
        done = step - self.step0
        if done <= 0 or step >= self.max_steps:
            return ""
        return f" | eta {hms((time.perf_counter() - self.t0) / done * (self.max_steps - step))}"

    def _summary(self, r: dict) -> list[str]:
        from runtime.checkpoint import find_latest

        def val(v):
            return "n/a" if v is None else f"{v:.4f} (ppl {perplexity(v):.2f})"

        rd, w = self.run_dir, self.wandb
        tps = (r["steps"] - self.step0) * self.batch_tokens / max(r["wall_s"], 1e-9)
        return [
            f"{'diverged' if r['diverged'] else 'finished'}: {r['steps']} steps, {r['tokens']:,} tokens | "
            f"this process {hms(r['wall_s'])}, {tps:,.0f} tok/s"
            + (f" | all segments {hms(r['train_s'])} (resumed)" if self.resumed else ""),
            f"val loss: final {val(r['final_val_loss'])}"
            + (f", {r['final_val_bpb']:.4f} bits per byte" if r.get("final_val_bpb") is not None else "")
            + f"; best of the sampled evals {val(r['best_val_loss'])} | spikes: loss "
            f"{r['spikes_loss']}, grad norm {r['spikes_grad_norm']} | skipped steps {r['skipped_steps']}",
            f"checkpoint {find_latest(rd)} | metrics {rd / 'metrics.jsonl'} | config {rd / 'config.yaml'}"
            + (f" | wandb run {w.run_id} ({w.mode}{', ' + w.url if w.url else ''}, {rd / 'wandb'})" if w
               else " | wandb disabled"),
            f"next: python eval.py {rd} | python sample.py {rd} --prompt \"...\" | "
            f"python scripts/plot_curves.py {rd} --out {rd / 'curves'}",
        ]


def start_line(run_dir: Path, norm: str, params: int, ranks: int, micro_batch: int, block_size: int, accum: int,
               batch_tokens: int, precision: str, compiled: bool, device, resumed_from=None, step: int = 0,
               branched: bool = False) -> str:
    """The console's first line of a run: where, what, how big a step, on what."""
    return (f"run dir {run_dir} | {norm} | {params / 1e6:.2f}M params | "
            f"{ranks} rank(s) x {micro_batch} seq x {block_size} tok x {accum} accum = "
            f"{batch_tokens} tok/step | {precision} | compile={compiled} | device {device}"
            + (f" | {'branched' if branched else 'resumed'} from {resumed_from} at step {step}"
               if resumed_from else ""))


def summary_record(step: int, batch_tokens: int, last_val: Optional[float], best_val: float, final, spike_counts: dict,
                   skipped: int, diverged: bool, norm: str, seed: int, wall_s: float, train_s: float) -> dict:
    """The run's last record (`summary`): final and best validation loss, spikes, skipped steps, times. The
    final loss and bpb are the final evaluation's (`final`, a validation.ValResult) where it ran, else the
    last evaluation's (a diverged run)."""
    from common.provenance import code_commit

    fin = {"final_val_loss": last_val, "final_val_bpb": None, "final_val_se_bpb": None, "final_val_tokens": None}
    if final is not None:
        fin = {"final_val_loss": final.loss, "final_val_bpb": final.bpb, "final_val_se_bpb": final.se_bpb(),
               "final_val_tokens": final.tokens}
        last_val = final.loss
    return {"kind": "summary", "step": step, "tokens": step * batch_tokens,
            **fin, "final_val_ppl": perplexity(last_val),
            "best_val_loss": best_val if math.isfinite(best_val) else None, **spike_counts,
            "skipped_steps": skipped, "steps": step,
            # a run that ends on a non-finite validation loss diverged, even if no step's loss was counted so
            "diverged": bool(diverged) or (last_val is not None and not math.isfinite(last_val)),
            "norm": norm, "seed": seed, "wall_s": wall_s, "train_s": train_s, "commit": code_commit()}


def check_wandb_login(wandb_cfg) -> None:
    """`logging.wandb.mode=online` needs an API key (WANDB_API_KEY, or `wandb login`'s entry in ~/.netrc): said in
    one line at start-up, before any data is prepared, instead of wandb's traceback after it."""
    import netrc
    import os
    from urllib.parse import urlparse

    if wandb_cfg.mode != "online" or os.environ.get("WANDB_API_KEY"):
        return
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
        if os.path.isfile(path) and netrc.netrc(path).authenticators(host):
            return
    except (OSError, netrc.NetrcParseError):
        pass
    from common import ConfigError

    raise ConfigError(f"logging.wandb.mode=online needs a wandb API key and none is configured for {host}: run "
                      "`wandb login`, or set WANDB_API_KEY, or pass logging.wandb.mode=offline (sync later with "
                      "`wandb sync`)")


class FileLog(logging.FileHandler):
    """<run dir>/train.log: the console's lines, appended, from the moment the run dir is claimed."""

    def __init__(self, run_dir: Path):
        super().__init__(run_dir / "train.log", mode="a", encoding="utf-8")
        self.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        logging.getLogger().addHandler(self)

    def log(self, record: dict) -> None:  # a sink by its interface: its records reach it through logging
        pass

    def close(self) -> None:
        logging.getLogger().removeHandler(self)
        super().close()


def write_hydra_record(run_dir: Path, resolved: dict) -> None:
    """<run dir>/.hydra/{config,hydra,overrides}.yaml, as Hydra would write them, written here once the run is
    accepted (Hydra's own writing is off: it came before any check). Nothing outside a Hydra app."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    d = run_dir / ".hydra"
    d.mkdir(exist_ok=True)
    atomic_write(d / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(resolved)))
    atomic_write(d / "hydra.yaml", OmegaConf.to_yaml(OmegaConf.create({"hydra": hc})))
    atomic_write(d / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(list(hc.overrides.task))))


def open_run_sinks(run_dir: Path, run_cfg, step: int, resumed: bool, config_changed: bool,
                   wandb_run_id: Optional[str]) -> tuple[list, Optional[str]]:
    """Rank 0 at the start of a run, with the run dir claimed: config.yaml and .hydra/ (a changed config on
    resume keeps the old one beside it as config_until_<step>.yaml; a resume with nothing to train leaves
    them as they are), metrics.jsonl cut back to `step` on resume, and the sinks: metrics.jsonl, train.log,
    wandb unless disabled, the console if `logging.console`. Returns (sinks, wandb run id)."""
    from omegaconf import OmegaConf

    log_cfg, train_cfg, resolved = run_cfg.logging, run_cfg.train, run_cfg.composed
    run_dir.mkdir(parents=True, exist_ok=True)
    # train.log where the console is configured (train.py: Hydra's stdout logging); a library caller keeps
    # Python's own fallback to stderr, which any handler of ours would silence
    file_log = FileLog(run_dir) if logging.getLogger().handlers else None
    if resumed and step >= train_cfg.max_steps:  # nothing will train: the records describe what ran
        sinks = [s for s in [file_log] if s] + ([ConsoleSink(run_dir, train_cfg.max_steps, train_cfg.batch_tokens,
                                                             step, resumed, None)] if log_cfg.console else [])
        return sinks, wandb_run_id
    write_hydra_record(run_dir, resolved)
    cfg_path = run_dir / "config.yaml"
    if config_changed and cfg_path.is_file():  # the config the steps so far ran with stays beside the new one
        kept = run_dir / f"config_until_{step:08d}.yaml"
        if not kept.exists():
            cfg_path.replace(kept)
            log.warning(f"config changed on resume: the previous config.yaml is kept as {kept}")
    atomic_write(cfg_path, OmegaConf.to_yaml(OmegaConf.create(resolved)))
    metrics = run_dir / "metrics.jsonl"
    if resumed:
        truncate_jsonl(metrics, step)
    sinks, wandb = [JsonlSink(metrics)] + ([file_log] if file_log else []), None
    if log_cfg.wandb.mode != "disabled":
        wandb = WandbSink(log_cfg.wandb, str(run_cfg.run_name), run_dir, resolved, wandb_run_id)
        wandb_run_id = wandb.run_id
        sinks.append(wandb)
    if log_cfg.console:
        sinks.append(ConsoleSink(run_dir, train_cfg.max_steps, train_cfg.batch_tokens, step, resumed, wandb))
    return sinks, wandb_run_id
