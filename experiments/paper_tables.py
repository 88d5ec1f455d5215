"""A paper table in the paper's layout from its rows' run dirs (scripts/paper.py --table).

Grid tables (the default kind): one row per experiment, two lines each (the paper's numbers and ours), one
column per point; every number stands beside its difference from the row's reference (Pre-LN), because
absolute losses differ with tokenizer, data and split, and the differences are what reproduce. Ours is the
mean over seeds of the finished runs that did not fail, at the best optim.lr where the row swept it.
Zero-shot tables: per row, one line per metric (lm-evaluation-harness, from each run's newest eval file),
one column per variant, the best marked, and the paper's reported numbers and counts beside them.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from . import runs as runlib


def _mean(xs: list) -> float | None:
    return statistics.fmean(xs) if xs else None


def our_values(runs: list, metric: str) -> dict[str, object]:
    """label -> the mean metric over ok runs, "diverged" where every run failed; at the best lr if swept."""
    groups = runlib.group_runs(runs)
    if any(len({runlib.get_key(r.config, "optim.lr") for r in g}) > 1 for g in groups.values()):
        groups = {k: v["runs"] for k, v in runlib.best_over(groups, "optim.lr").items()}
    out = {}
    for label, rs in groups.items():
        ok = [r for r in rs if r.finished and not r.failed]
        vals = [r.final_val_ppl if metric == "val_ppl" else r.final_val_loss for r in ok]
        out[label] = _mean([v for v in vals if v is not None]) if ok else ("diverged" if rs else None)
    return out


def _cell(v, ref, digits: int) -> str:
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    if isinstance(ref, (int, float)) and not isinstance(ref, bool):
        return f"{v:.{digits}f} ({v - ref:+.{digits}f})"
    return f"{v:.{digits}f}"


def sweep_dir(runs_root: Path, row: str, data: str | None, stand: dict) -> tuple[Path, str | None]:
    """The row's sweep dir and the stand-in data config it was trained on (None: the paper's data)."""
    if data in stand:
        return runs_root / f"{row}-{stand[data]}", stand[data]
    return runs_root / row, None


def _row_data(row: str) -> str | None:
    """The data config an experiment names (read from its file: no composition needed)."""
    import yaml

    path = Path(__file__).resolve().parent.parent / "configs" / "experiment" / f"{row}.yaml"
    for d in yaml.safe_load(path.read_text()).get("defaults", []):
        if isinstance(d, dict) and "override /data" in d:
            return d["override /data"]
    return None


def grid_table(spec: dict, settings: dict, runs_root: Path, stand: dict, stand_ins: dict) -> list[str]:
    cols, ref = spec["columns"], spec.get("reference", "pre_ln")
    ref_rows = spec.get("reference_rows", {})  # an ablation's Pre-LN lives in the main table's row
    lines = [f"### {spec['title']}", "",
             f"Each number with its difference from {ref} in the same row (paper's and ours apart).", "",
             "| setting | | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    notes = []
    for row in spec["rows"]:
        setting = settings.get(row, {})
        metric, digits = setting.get("metric", "val_loss"), 2 if setting.get("metric") == "val_ppl" else 4
        data = _row_data(row)
        path, used = sweep_dir(runs_root, row, data, stand)
        ours = our_values(runlib.load_sweep(path), metric)
        ref_row = ref_rows.get(row, row)
        paper_ref = settings.get(ref_row, {}).get("values", {}).get(ref)
        ours_ref = ours.get(ref) if ref_row == row else our_values(
            runlib.load_sweep(sweep_dir(runs_root, ref_row, data, stand)[0]), metric).get(ref)
        pv, pn = setting.get("values", {}), setting.get("notes", {})
        mark = ""
        if used:
            mark = " †"
            caveat = stand_ins.get(used, {}).get("caveat", f"trained on {used} instead of {data}")
            notes.append(f"† {row}: {caveat}")
        name = row.split("_", 1)[1] if "_" in row else row
        lines.append(f"| {name} ({metric}) | paper | " + " | ".join(
            _cell(pv.get(c), paper_ref, digits) if c in pv else pn.get(c, "—") for c in cols) + " |")
        lines.append(f"| | ours{mark} | " + " | ".join(_cell(ours.get(c), ours_ref, digits) for c in cols) + " |")
        if not any(isinstance(v, float) for v in ours.values()):
            notes.append(f"{row}: no finished runs under {path}")
    return lines + ([""] + notes if notes else [])


def newest_eval(run_dir: Path) -> dict:
    files = sorted((Path(run_dir) / "eval").glob("eval_*.json"))
    return json.loads(files[-1].read_text()) if files else {}


def zero_shot_table(spec: dict, settings: dict, runs_root: Path, stand: dict, stand_ins: dict) -> list[str]:
    paper = spec.get("paper", {})
    lines = [f"### {spec['title']}", ""]
    methods = set(spec.get("methods", []))
    for row in spec["rows"]:
        path, used = sweep_dir(runs_root, row, _row_data(row), stand)
        by_label: dict[str, list[dict]] = {}
        for r in runlib.load_sweep(path):
            res = newest_eval(r.path).get("tasks") or {}
            by_label.setdefault(r.label, []).append(res)
        labels = runlib.sort_labels(by_label)
        title = f"**{row}**" + (f" († {stand_ins.get(used, {}).get('caveat', used)})" if used else "")
        if not labels:  # no run of this row yet: say so, not a table of empty columns and "best on 0"
            lines += [title, "", f"no runs under {path} yet (scripts/paper.py trains them, then scores them with "
                                 "--eval)", ""]
            continue
        lines += [title, "", "| metric | " + " | ".join(labels) + " | best | paper |",
                  "|---|" + "---|" * (len(labels) + 2)]
        wins = 0
        for m in spec["metrics"]:
            key, lower = m.rstrip("+-"), m.endswith("-")
            task, metric = key.split("/")
            vals = {lb: _mean([res[task][metric] for res in by_label[lb] if metric in res.get(task, {})])
                    for lb in labels}
            have = {lb: v for lb, v in vals.items() if v is not None}
            best = (min if lower else max)(have, key=have.get) if have else None
            wins += best in methods
            pp = paper.get("values", {}).get(key, {})
            lines.append(f"| {key} ({'lower' if lower else 'higher'} is better) | "
                         + " | ".join("—" if vals[lb] is None else f"{vals[lb]:.4g}" for lb in labels)
                         + f" | {best or '—'} | " + (", ".join(f"{k} {v}" for k, v in pp.items()) or "—") + " |")
        count = paper.get("best_count", {}).get(row)
        lines += ["", f"{' / '.join(sorted(methods))} best on {wins}/{len(spec['metrics'])} metrics"
                  + (f" (paper: {count})" if count else ""), ""]
    if paper.get("note"):
        lines.append(paper["note"])
    return lines


def write(spec: dict, settings: dict, runs_root: Path, stand: dict, stand_ins: dict) -> str:
    kind = spec.get("kind", "grid")
    fn = zero_shot_table if kind == "zero_shot" else grid_table
    return "\n".join(fn(spec, settings, runs_root, stand, stand_ins)) + "\n"
