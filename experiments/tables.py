"""The results table: final validation loss / perplexity per variant group (mean, std and 95% interval over
seeds, Welch against the best row), spikes, divergence, the paper's numbers beside ours; Markdown and LaTeX
(scripts/make_table.py is the command line and says what each column means)."""
from __future__ import annotations

import math
import statistics

from experiments import runs as runlib
from common.stats import summarize, verdict


def mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None)


def build_rows(groups: dict[str, list[runlib.Run]], paper: dict | None) -> list[dict]:
    """One dict per label: the numbers behind a table row (tests check these)."""
    rows = []
    labels = list(groups)
    if paper:  # the paper's variants we did not run still get a row, so nothing is hidden
        labels += [k for k in list(paper.get("values", {})) + list(paper.get("notes", {})) if k not in labels]
        if all(lbl in runlib.variant_order() for lbl in labels):  # paper-only rows in their usual place
            labels = runlib.sort_labels(labels)
    for label in labels:
        runs = groups.get(label, [])
        ok = [r for r in runs if not r.failed and r.final_val_loss is not None]
        loss_m, loss_s = mean_std([r.final_val_loss for r in ok])
        ppl_m, ppl_s = mean_std([r.final_val_ppl for r in ok])
        bpb = [r.final_val_bpb for r in ok]
        bpb_m, bpb_s = mean_std(bpb) if bpb and None not in bpb else (None, None)   # runs from before bpb: none
        summary = summarize([r.final_val_loss for r in ok])
        rows.append({
            "label": label, "n": len(runs), "seeds": [r.seed for r in runs],
            "values": list(summary.values), "ci": (summary.lo, summary.hi),
            "commits": sorted({str((r.summary or {}).get("commit") or "unrecorded") for r in runs}),
            "loss_mean": loss_m, "loss_std": loss_s, "ppl_mean": ppl_m, "ppl_std": ppl_s,
            "bpb_mean": bpb_m, "bpb_std": bpb_s,
            "spikes_loss": sum(r.spike_count("loss") for r in runs),
            "spikes_grad_norm": sum(r.spike_count("grad_norm") for r in runs),
            "diverged": sum(r.diverged for r in runs),
            "failed": sum(r.failed for r in runs),
            "unfinished": sum(not r.finished for r in runs),
            "paper_value": (paper or {}).get("values", {}).get(label),
            "paper_note": (paper or {}).get("notes", {}).get(label),
        })
    return rows


def _num(m: float | None, s: float | None, digits: int, pm: str) -> str:
    if m is None:
        return "—"
    if not math.isfinite(m):
        return "inf"
    return f"{m:.{digits}f}" if s is None else f"{m:.{digits}f}{pm}{s:.{digits}f}"


def _cells(row: dict, paper: dict | None, pm: str, dagger: str) -> list[str]:
    if row["n"] == 0:
        loss = ppl = bpb = "not run"
    elif row["loss_mean"] is None:
        loss = ppl = bpb = "diverged" if row["diverged"] else ("failed" if row["failed"] else "—")
    else:
        mark = (dagger if row["failed"] else "") + ("*" if row["unfinished"] else "")
        loss = _num(row["loss_mean"], row["loss_std"], 4, pm) + mark
        ppl = _num(row["ppl_mean"], row["ppl_std"], 2, pm) + mark
        bpb = _num(row.get("bpb_mean"), row.get("bpb_std"), 4, pm) + (mark if row.get("bpb_mean") is not None else "")
    div = f"{row['diverged']}/{row['n']}" if row["n"] else "—"
    fail = f"{row['failed']}/{row['n']}" if row["n"] else "—"
    lo, hi = row.get("ci", (None, None))
    per_seed = ", ".join(f"{v:.4f}" for v in row.get("values", [])) or "—"
    cells = [row["label"], str(row["n"]), loss, per_seed, "—" if lo is None else f"[{lo:.4f}, {hi:.4f}]", bpb, ppl,
             f"{row['spikes_loss']} / {row['spikes_grad_norm']}" if row["n"] else "—", div, fail,
             row.get("vs_best", "—")]
    if "best_value" in row:
        best = "—" if row["best_value"] is None else _fmt_value(row["best_value"])
        best += " (edge)" if row.get("edge") else ""
        best += (
            f" (chosen on {row['chosen_on']} of {row['n']} seeds)" if row.get("chosen_on", row["n"]) < row["n"] else ""
        )
        cells[1:1] = [best,
                      ", ".join(f"{_fmt_value(v)}: " + ("failed" if not math.isfinite(x) else f"{x:.4f}")
                                for v, x in sorted(row["by_value"].items(), key=lambda kv: _sort_key(kv[0])))]
    if paper is not None:
        digits = 2 if paper.get("metric") == "val_ppl" else 4
        v = row["paper_value"]
        text = f"{v:.{digits}f}" if v is not None else ""
        if row["paper_note"]:
            text = f"{text} ({row['paper_note']})" if text else row["paper_note"]
        cells.append(text or "—")
    return cells


def add_comparisons(rows: list[dict]) -> None:
    """row["vs_best"]: the row against the best rankable row (lowest mean; not at a grid edge), by Welch's test."""
    rankable = [r for r in rows if r["loss_mean"] is not None and not r.get("edge")]
    top = min(rankable, key=lambda r: r["loss_mean"], default=None)
    for r in rows:
        if r["loss_mean"] is None:
            r["vs_best"] = "—"
        elif r.get("edge"):
            r["vs_best"] = "not ranked: best at the grid edge"
        elif r is top:
            r["vs_best"] = "best"
        else:
            r["vs_best"] = verdict(r["values"], top["values"], r["label"], top["label"])


def _fmt_value(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _sort_key(v):
    return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))


def best_rows(runs: list[runlib.Run], key: str, order: list[str], paper: dict | None) -> list[dict]:
    """Rows of --best-over KEY: each row's runs at its best value of KEY (runlib.best_over)."""
    missing = object()
    if runs and all(runlib.get_key(r.config, key, missing) is missing for r in runs):
        raise SystemExit(f"--best-over {key}: no run's config.yaml has that key (a typo? e.g. optim.lr, "
                         "optim.groups.scalars.lr_mult)")
    groups: dict[str, list[runlib.Run]] = {}
    for r in runs:
        groups.setdefault(runlib.label_without(r, key), []).append(r)
    groups = {k: groups[k] for k in runlib.sort_labels(groups, order)}
    best = runlib.best_over(groups, key)
    rows = build_rows({label: b["runs"] for label, b in best.items()}, paper)
    for row in rows:  # rows of paper variants we did not run have no best value
        b = best.get(row["label"], {})
        row["best_value"], row["by_value"] = b.get("value"), b.get("by_value", {})
        row["edge"] = at_edge(row["best_value"], row["by_value"])
        row["chosen_on"] = b.get("common_seeds", row["n"])
    return rows


def at_edge(value, by_value: dict) -> bool:
    """A numeric best value that is the largest or smallest of at least two values tried."""
    nums = [v for v in by_value if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return value is not None and len(nums) >= 2 and value in (min(nums), max(nums))


def _header(paper: dict | None, best_over: str | None = None) -> list[str]:
    h = ["variant", "seeds", "final val loss", "per seed", "95% CI", "val bits per byte", "val ppl",
         "spikes loss / grad", "diverged", "failed", "vs best (Welch)"]
    if best_over:
        h[1:1] = [f"best {best_over}", f"{best_over}: mean loss (common seeds)"]
    if paper is not None:
        h.append(f"paper ({'val ppl' if paper.get('metric') == 'val_ppl' else 'val loss, its tokenizer'})")
    return h


def _footnotes(rows: list[dict], paper: dict | None, setting: str | None) -> list[str]:
    notes = ["mean ± std over seeds (std needs ≥ 2 seeds); 95% CI: t interval of the mean; spikes summed over seeds. "
             "failed = diverged, or final val loss above the initial one.",
             "final val loss: nats per token of the run's tokenizer; bits per byte: the same nats over the UTF-8 bytes "
             "of the scored text, / ln 2 (comparable across tokenizers; — for runs recorded before it).",
             "vs best: Welch's t-test against the best row; 'ahead' only where p < 0.05, else 'not separated'."]
    if any(r.get("edge") for r in rows):
        notes.append("(edge): the best value is at the edge of what was tried; the row is not ranked until one "
                     "more value beyond it has run.")
    commits = sorted({c for r in rows for c in r.get("commits", [])})
    if commits:
        notes.append("code commit of the runs: " + ", ".join(commits) + ".")
    if any(r["failed"] and r["loss_mean"] is not None for r in rows):
        notes.append("† some seeds failed; the mean is over the others.")
    if any(r["unfinished"] for r in rows):
        notes.append("* some runs had not finished; their last evaluation is used.")
    if paper is not None:
        notes.append(f"paper: {paper.get('description', setting)} (setting {setting}).")
    return notes


def to_markdown(rows: list[dict], paper: dict | None, setting: str | None, title: str | None,
                best_over: str | None = None) -> str:
    h = _header(paper, best_over)
    lines = [f"**{title}**", ""] if title else []
    lines += ["| " + " | ".join(h) + " |", "|" + "|".join("---" for _ in h) + "|"]
    lines += ["| " + " | ".join(_cells(r, paper, " ± ", "†")) + " |" for r in rows]
    lines += [""] + [f"{n}  " for n in _footnotes(rows, paper, setting)]
    return "\n".join(lines).rstrip() + "\n"


def _tex(s: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("%", r"\%"), ("&", r"\&"), ("#", r"\#"),
                 ("—", "--"), ("†", r"$^\dagger$"), ("±", r"$\pm$"), ("≥", r"$\geq$")):
        s = s.replace(a, b)
    return s


def to_latex(rows: list[dict], paper: dict | None, setting: str | None, title: str | None,
             best_over: str | None = None) -> str:
    h = _header(paper, best_over)
    out = [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{l" + "r" * (len(h) - 1) + "}",
           r"\toprule", " & ".join(_tex(x) for x in h) + r" \\", r"\midrule"]
    out += [" & ".join(_tex(c) for c in _cells(r, paper, " ± ", "†")) + r" \\" for r in rows]
    out += [r"\bottomrule", r"\end{tabular}"]
    cap = " ".join(_footnotes(rows, paper, setting))
    out += [r"\caption{" + _tex((title + ". ") if title else "") + _tex(cap) + "}", r"\end{table}"]
    return "\n".join(out) + "\n"


def markdown_of(run_dirs: list, title: str | None = None) -> str:
    """The Markdown table of the runs under `run_dirs`, as `make_table.py <run_dirs> --title T` prints it."""
    runs = [runlib.load_run(p) for p in runlib.find_runs([str(d) for d in run_dirs])]
    meta = runlib.experiment_meta(runs)
    setting = meta.get("paper_setting")
    paper = runlib.load_paper(setting)
    rows = build_rows(runlib.group_runs(runs, runlib.label_order(meta)), paper)
    add_comparisons(rows)
    return to_markdown(rows, paper, setting, title or meta.get("name"), None)
