"""Reading run directories for the tables, plots and study reports (one job: runs -> labelled records).

A run directory holds `config.yaml` (resolved Hydra config) and `metrics.jsonl` (one JSON record per
line, written by trainer/sinks.py; kinds and keys in docs/training.md, "Monitoring"). Runs are grouped by
a label: the point label sweep.py recorded in the sweep's `sweep.json`, else the matching
`experiment_meta.points` entry of the run's config, else `norm.name`, plus any `--group-by` keys.
"""
from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from common import perplexity
from data.files import atomic_write, read_json

PAPER_RESULTS = Path(__file__).resolve().parent.parent / "scripts" / "paper_results.yaml"
# Canonical row order for tables and legends: the variant registry's (then anything else, alphabetically).
@functools.cache
def variant_order() -> list[str]:
    """The registry's variant order (imports the model, and so torch, on first use only: the scripts
    that only read run dirs start without it)."""
    from model import VARIANTS

    return list(VARIANTS)


@dataclass
class Run:
    path: Path
    config: dict
    label: str
    seed: Any
    train: list = field(default_factory=list)   # metrics.jsonl lines by kind, in file order
    evals: list = field(default_factory=list)
    spikes: list = field(default_factory=list)
    stats: list = field(default_factory=list)
    summary: dict | None = None
    base: str = ""                               # sweep point label before its --grid axes
    axes: dict = field(default_factory=dict)     # the --grid axes' values of this point
    cell: str | None = None                      # a study's cell of this point (sweep.json), None outside studies

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def diverged(self) -> bool:
        if self.summary is not None and self.summary.get("diverged"):
            return True
        last = self.final_val_loss
        # A run that stopped with a non-finite loss diverged, whatever its summary says.
        return last is not None and not math.isfinite(last)

    @property
    def initial_val_loss(self) -> float | None:
        """The first evaluation's loss (step 0: the initialised model)."""
        return _loss(self.evals[0].get("val_loss")) if self.evals else None

    @property
    def failed(self) -> bool:
        """Diverged, or ended with a validation loss above its initial one (it trained backwards)."""
        if self.diverged:
            return True
        first, last = self.initial_val_loss, self.final_val_loss
        return first is not None and last is not None and len(self.evals) > 1 and last > first

    @property
    def final_val_loss(self) -> float | None:
        if self.summary is not None and self.summary.get("final_val_loss") is not None:
            return float(self.summary["final_val_loss"])
        return _loss(self.evals[-1].get("val_loss")) if self.evals else None

    @property
    def final_val_bpb(self) -> float | None:
        """Bits per byte of the final evaluation (the summary's), else of the last evaluation; None for a run
        recorded before bits per byte were."""
        if self.summary is not None and self.summary.get("final_val_bpb") is not None:
            return float(self.summary["final_val_bpb"])
        v = self.evals[-1].get("val_bpb") if self.evals else None
        return None if v is None else float(v)

    @property
    def final_val_ppl(self) -> float | None:
        if self.summary is not None and self.summary.get("final_val_ppl") is not None:
            return float(self.summary["final_val_ppl"])
        if self.evals and self.evals[-1].get("val_ppl") is not None:
            return float(self.evals[-1]["val_ppl"])
        loss = self.final_val_loss
        return perplexity(loss)

    def spike_count(self, metric: str) -> int:
        key = f"spikes_{metric}"
        if self.summary is not None and self.summary.get(key) is not None:
            return int(self.summary[key])
        return sum(1 for s in self.spikes if s.get("metric") == metric)

    @property
    def last_step(self) -> int | None:
        for lines in (self.evals, self.train):
            if lines:
                return lines[-1].get("step")
        return None


def _loss(value) -> float:
    """A recorded loss; null is how the sinks write a non-finite one (NaN has no JSON spelling)."""
    return math.nan if value is None else float(value)


def get_key(cfg: dict, dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def read_metrics(path: Path) -> dict[str, list]:
    """metrics.jsonl -> lines by kind. A torn last line (run killed mid-write) is ignored."""
    out: dict[str, list] = {"train": [], "eval": [], "spike": [], "stats": [], "summary": []}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError:
        raise SystemExit(f"{path}: not a text file (a corrupt metrics.jsonl?); restore it or leave the run out") \
            from None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)  # json accepts NaN/Infinity, which diverged runs write
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                continue  # a torn last line: the run was killed mid-write
            raise SystemExit(f"{path}:{i + 1}: not a JSON line (a corrupt metrics.jsonl?); restore it or leave "
                             "the run out") from None
        if not isinstance(rec, dict):
            raise SystemExit(f"{path}:{i + 1}: a JSON {type(rec).__name__}, not a record")
        out.setdefault(rec.get("kind", "?"), []).append(rec)
    return out


def is_finished(run_dir: Path) -> bool:
    """True when metrics.jsonl ends with a `summary` line (the run completed)."""
    p = Path(run_dir) / "metrics.jsonl"
    if not p.is_file():
        return False
    try:
        return bool(read_metrics(p)["summary"])
    except SystemExit:
        return False


def _load_config(run_dir: Path) -> dict:
    for name in ("config.yaml", ".hydra/config.yaml"):
        p = run_dir / name
        if p.is_file():
            with open(p) as f:
                return yaml.safe_load(f) or {}
    return {}


def _sweep_point(run_dir: Path) -> dict:
    """The point sweep.py recorded for this run dir (parent dir's sweep.json), or {}."""
    p = run_dir.parent / "sweep.json"
    if not p.is_file():
        return {}
    with open(p) as f:
        manifest = json.load(f)
    return next((pt for pt in manifest.get("points", []) if pt.get("dir") == run_dir.name), {})


def _point_label(cfg: dict) -> str | None:
    """The experiment_meta.points entry whose overrides this run's config matches."""
    points = get_key(cfg, "experiment_meta.points") or {}
    for label, overrides in points.items():
        if all(_matches(cfg, k, v) for k, v in (overrides or {}).items()):
            return label
    return None


def _matches(cfg: dict, key: str, want: Any) -> bool:
    if key == "norm":  # a group choice: the composed config says it as norm.name
        key = "norm.name"
    have = get_key(cfg, key)
    if isinstance(want, float) or isinstance(have, float):
        try:
            return math.isclose(float(have), float(want), rel_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return str(have) == str(want)


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def load_run(run_dir: Path, group_by: Iterable[str] = ()) -> Run:
    run_dir = Path(run_dir)
    cfg = _load_config(run_dir)
    m = read_metrics(run_dir / "metrics.jsonl")
    summary = m["summary"][-1] if m["summary"] else None
    point = _sweep_point(run_dir)
    label = point.get("label") or _point_label(cfg)
    if label is None:
        label = get_key(cfg, "norm.name") or (summary or {}).get("norm") or run_dir.name
    extra = [f"{k.split('.')[-1]}={_fmt(get_key(cfg, k))}" for k in group_by]
    if extra:
        label = f"{label} ({', '.join(extra)})"
    seed = get_key(cfg, "train.seed", (summary or {}).get("seed"))
    return Run(path=run_dir, config=cfg, label=label, seed=seed, train=m["train"], evals=m["eval"],
               spikes=m["spike"], stats=m["stats"], summary=summary, base=point.get("base", label),
               axes=dict(point.get("axes") or {}), cell=point.get("cell"))


def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Run dirs under the given paths: a dir with metrics.jsonl, or any dir below holding some."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise SystemExit(f"no such run directory: {p}")
        if (p / "metrics.jsonl").is_file():
            found.append(p)
        else:
            found.extend(sorted(q.parent for q in p.rglob("metrics.jsonl")))
    if not found:
        raise SystemExit(f"no run directories (with metrics.jsonl) under: {', '.join(map(str, paths))}")
    return list(dict.fromkeys(found))


def load_sweep(sweep_dir: Path) -> list[Run]:
    """Every run of one sweep directory; [] while it holds none yet (a study part not started)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir() or not any(sweep_dir.rglob("metrics.jsonl")):
        return []
    return [load_run(p) for p in find_runs([sweep_dir])]


def group_runs(runs: list[Run], order: list[str] | None = None) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.label, []).append(r)
    return {k: sorted(groups[k], key=lambda r: str(r.seed)) for k in sort_labels(groups, order)}


def sort_labels(labels: Iterable[str], order: list[str] | None = None) -> list[str]:
    order = list(order or []) + [v for v in variant_order() if v not in (order or [])]

    def key(label: str):
        base = label.split(" (")[0]
        return (order.index(base) if base in order else len(order), label)
    return sorted(labels, key=key)


def best_over(groups: dict[str, list[Run]], key: str) -> dict[str, dict]:
    """For each group of runs (rows of a table), the value of config `key` with the lowest mean final
    validation loss. The choice uses the seeds every value was run with (so a value that got extra
    seeds after it was chosen is not favoured by them); failed runs count as +inf.
    Returns label -> {value, runs (all seeds at that value), by_value: value -> mean over common seeds}."""
    out = {}
    for label, runs in groups.items():
        by_val: dict[Any, list[Run]] = {}
        for r in runs:
            by_val.setdefault(_hashable(get_key(r.config, key)), []).append(r)
        common = set.intersection(*({str(r.seed) for r in rs} for rs in by_val.values()))

        def score(rs: list[Run]) -> float:
            xs = [math.inf if r.failed or r.final_val_loss is None else r.final_val_loss
                  for r in rs if not common or str(r.seed) in common]
            return sum(xs) / len(xs) if xs else math.inf
        scores = {v: score(rs) for v, rs in by_val.items()}
        best = min(scores, key=lambda v: (scores[v], str(v)))
        out[label] = {"value": best, "runs": by_val[best], "by_value": scores,
                      "common_seeds": len(common) if common else len(by_val[best])}
    return out


def at_edge(best: dict) -> bool:
    """Whether a best_over result's value is the largest or smallest value tried (with one value tried,
    both): the optimum may lie beyond it, so the row is not ranked and a study brackets it."""
    tried = [float(v) for v in best["by_value"]]
    return float(best["value"]) in (min(tried), max(tried))


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def label_without(run: Run, key: str) -> str:
    """The run's label with the sweep's `--grid` axis of `key` left out (the row that `--best-over key`
    chooses within); runs not made by a grid over `key` keep their label."""
    if key not in run.axes:
        return run.label
    return run.base + "".join(f"-{k.split('.')[-1]}-{v}" for k, v in run.axes.items() if k != key)


def experiment_meta(runs: list[Run]) -> dict:
    """The experiment_meta the runs share (from their configs), or {}."""
    metas = [get_key(r.config, "experiment_meta") for r in runs]
    metas = [m for m in metas if m]
    return metas[0] if metas and all(m == metas[0] for m in metas) else {}


def label_order(meta: dict) -> list[str]:
    if meta.get("points"):
        return list(meta["points"])
    return list(meta.get("variants") or [])


def load_paper(setting: str | None, path: Path = PAPER_RESULTS) -> dict | None:
    if not setting:
        return None
    with open(path) as f:
        data = yaml.safe_load(f)
    settings = data.get("settings", {})
    if setting not in settings:
        raise SystemExit(f"unknown paper setting {setting!r} in {path}; valid: {', '.join(settings)}")
    return settings[setting]


def ok_losses(runs: Iterable[Run]) -> list[float]:
    """Final validation losses of the finished runs that did not fail (the numbers a table averages)."""
    return [r.final_val_loss for r in runs if r.finished and not r.failed and r.final_val_loss is not None]


def pm(xs: list[float], digits: int = 3) -> str:
    """'mean ± std' (std only from 2 values on); '—' for none."""
    if not xs:
        return "—"
    m = statistics.fmean(xs)
    return f"{m:.{digits}f}" + (f" ± {statistics.stdev(xs):.{digits}f}" if len(xs) > 1 else "")


def tokens_per_run(runs: list[Run]) -> int:
    """train.max_steps x train.batch_tokens of the first run (0 without runs): what one run of a sweep trains on."""
    cfg = runs[0].config if runs else {}
    return int(get_key(cfg, "train.max_steps", 0)) * int(get_key(cfg, "train.batch_tokens", 0))


def study_times(root: Path, study: str) -> dict:
    """{part: wall seconds} of a study, summed over its resumed invocations ({} before any part ran)."""
    path = Path(root) / f"{study}_times.json"
    return read_json(path) if path.is_file() else {}


def add_wall_time(path: Path, part: str, seconds: float) -> None:
    """Add `seconds` to `part`'s wall time in the JSON file `path` (a study's times, summed over resumes)."""
    path = Path(path)
    times = read_json(path) if path.is_file() else {}
    times[part] = times.get(part, 0.0) + seconds
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(times, indent=1) + "\n")


# --- learned scalars over training (the stats records' step/<j>/<name>, scalar/<name>, gate_mean/<i>) ---
def scalar_series(stats: list[dict]) -> dict[str, dict[str, tuple[list, list]]]:
    """kind -> {key: (tokens, values)} of every learned scalar in the stats records: a rule's step sizes
    (`step/<j>/a`: kind `a`), other one-element scalars (`scalar/blocks.0.attn_rule.norm.alpha`: kind
    `alpha`), the attention gates' means (`gate_mean/<i>`: kind `gate_mean`)."""
    out: dict[str, dict[str, tuple[list, list]]] = {}
    for rec in stats:
        for k, v in rec.items():
            if v is None or not k.startswith(("step/", "scalar/", "gate_mean/")):
                continue
            if k.startswith("step/"):
                kind = k.rsplit("/", 1)[-1]
            elif k.startswith("scalar/"):
                kind = k.rsplit(".", 1)[-1]
            else:
                kind = "gate_mean"
            xs, ys = out.setdefault(kind, {}).setdefault(k, ([], []))
            xs.append(rec["tokens"])
            ys.append(float(v))
    return {kind: dict(sorted(series.items())) for kind, series in sorted(out.items())}


def scalar_movement(stats: list[dict]) -> dict[str, dict]:
    """kind -> how far its scalars moved from their first record: the largest |x_last - x_first| over the
    kind's keys, the mean first and last values, and how many keys."""
    out = {}
    for kind, series in scalar_series(stats).items():
        firsts = [ys[0] for _, ys in series.values()]
        lasts = [ys[-1] for _, ys in series.values()]
        out[kind] = {"keys": len(series), "first": statistics.fmean(firsts), "last": statistics.fmean(lasts),
                     "max_abs_change": max(abs(b - a) for a, b in zip(firsts, lasts))}
    return out
