"""The tables every study gets (scripts/study.py writes them when a study names no report of its own):
for each sweep of the study, each cell at its best value of the tuned key, with every value's mean,
the per-seed losses, mean ± std, the 95% t interval, and the gap to the reference cell paired by seed (a
seed fixes the data order and the shared init, so the per-seed difference carries the comparison) with
one of three verdicts, Holm-corrected over the table: ahead, equivalent within ±0.02 (TOST; ±0.04
beside it), undecided.
"""
from __future__ import annotations

from pathlib import Path

from experiments import runs as runlib
from common.stats import MARGIN, PAPER_MARGIN, holm, paired, summarize, three_word_verdicts
from data.files import atomic_write, read_json


def cell_rows(study, runs: list) -> dict:
    """cell -> {value, edge, by_value, summary}: each cell at its best value (the lowest mean over seeds)."""
    rows, by_cell = {}, study.by_cell(runs)
    for cell, b in study.best(runs).items():
        spikes: dict = {}   # value -> loss spikes summed over its seeds: does a method tolerate a larger lr?
        for r in by_cell[cell]:
            v = float(runlib.get_key(r.config, study.key_of(cell)))
            spikes[v] = spikes.get(v, 0) + r.spike_count("loss")
        rows[cell] = {"value": float(b["value"]), "edge": runlib.at_edge(b),
                      "by_value": b["by_value"], "summary": summarize(runlib.ok_losses(b["runs"])),
                      "spikes": [r.spike_count("loss") for r in b["runs"]], "failed": sum(r.failed for r in b["runs"]),
                      "spikes_by_value": spikes, "by_seed": by_seed(b["runs"])}
    return rows


def by_seed(runs: list) -> dict:
    """seed -> final validation loss of the finished runs that did not fail (what a paired test reads)."""
    return {str(r.seed): r.final_val_loss for r in runs
            if r.finished and not r.failed and r.final_val_loss is not None}


def paired_columns(comparisons: list, names: list) -> list[tuple]:
    """(gap [CI], verdict at ±MARGIN, TOST at ±PAPER_MARGIN) per comparison, Holm over the list."""
    verdicts = three_word_verdicts(comparisons, names)
    wide = holm([c.p_equiv.get(PAPER_MARGIN) for c in comparisons])
    return [(f"{c.mean:+.3f} {c.ci()}", v, "—" if w is None else
             f"{'equivalent' if w < 0.05 else 'not shown'} (p={w:.2g})")
            for c, v, w in zip(comparisons, verdicts, wide)]


def table(study, rows: dict) -> list[str]:
    key = study.key.rsplit(".", 1)[-1]
    ref_of = {cell: study.reference_of(cell) for cell in rows}
    tested = [c for c, r in rows.items() if not r["edge"] and ref_of[c] in rows and c != ref_of[c]]
    columns = dict(zip(tested, paired_columns([paired(rows[c]["by_seed"], rows[ref_of[c]]["by_seed"]) for c in tested],
                                              [(c, ref_of[c]) for c in tested])))
    out = [f"| cell | each {key}: mean | best {key} | per seed | mean ± std | 95% CI | loss spikes (per seed) | "
           f"loss spikes at each {key} (all seeds) | gap to {study.reference or 'the reference'}, paired [95% CI] | "
           f"verdict (Holm; TOST ±{MARGIN:g}) | TOST ±{PAPER_MARGIN:g} (Holm) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for cell, r in rows.items():
        each = ", ".join(f"{v:g}: {m:.3f}" for v, m in sorted(r["by_value"].items()))
        s = r["summary"]
        gap, vs, wide = columns.get(cell, ("—", "not ranked (edge)" if r["edge"] else "—", "—"))
        failed = f" ({r['failed']} failed)" if r["failed"] else ""
        out.append(f"| {cell} | {each} | {r['value']:g}{' (edge)' if r['edge'] else ''} | {s.per_seed()}{failed} | "
                   f"{s.mean_std()} | {s.ci()} | {', '.join(map(str, r['spikes']))} | "
                   f"{', '.join(f'{v:g}: {n}' for v, n in sorted(r['spikes_by_value'].items()))} | {gap} | {vs} | "
                   f"{wide} |")
    return out


def contrasts(study, runs: list) -> list[str]:
    """Each of the study's contrasts: cell a against cell b at one value of their tuned key, paired by seed,
    Holm over the contrasts."""
    by_cell, found = study.by_cell(runs), []
    for c in study.contrasts:
        at = float(c["at"])
        xs = {k: [r for r in by_cell.get(c[k], []) if float(runlib.get_key(r.config, study.key_of(c[k]))) == at]
              for k in ("a", "b")}
        if xs["a"] and xs["b"]:
            found.append((c, at, xs))
    if not found:
        return []
    key = study.key.rsplit(".", 1)[-1]
    cols = paired_columns([paired(by_seed(xs["a"]), by_seed(xs["b"])) for _, _, xs in found],
                          [(c["a"], c["b"]) for c, _, _ in found])
    out = [
        "",
        f"Contrasts (a cell against another at one {key}, not each at its best; paired by seed, Holm over "
        "the contrasts):",
        "",
        f"| cell | {key} | per seed | mean ± std | 95% CI | loss spikes (per seed) | gap a − b [95% CI] | "
        f"verdict (Holm; TOST ±{MARGIN:g}) | TOST ±{PAPER_MARGIN:g} (Holm) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (c, at, xs), (gap, vs, wide) in zip(found, cols):
        for k in ("a", "b"):
            sm = summarize(runlib.ok_losses(xs[k]))
            tail = f"{gap} | {vs} | {wide}" if k == "a" else "— | — | —"
            out.append(f"| {c[k]} | {at:g} | {sm.per_seed()} | {sm.mean_std()} | {sm.ci()} | "
                       f"{', '.join(str(r.spike_count('loss')) for r in xs[k])} | {tail} |")
    return out


def report(study, root: Path, docs: Path) -> None:
    out = docs / study.name
    times, commits_path = runlib.study_times(root, study.name), root / f"{study.name}_commits.json"
    commits = read_json(commits_path) if commits_path.is_file() else {}
    lines = [
        f"# {study.name}: tables",
        "",
        f"Generated by `python scripts/study.py {study.name} --report` from the "
        f"run dirs ({study.path.name}). Final validation loss; the best value is the lowest mean over the seeds; "
        "(edge): the largest or smallest value tried, not ranked; each cell against its reference paired by "
        "seed: 'ahead' where the Holm-corrected paired t-test rejects 0, 'equivalent within ±m' where the "
        "Holm-corrected TOST rejects a gap of m or more, else 'undecided'.",
        "",
        "Wall time per part: "
        + (", ".join(f"{k} {v / 60:.1f} min" for k, v in times.items()) or "—")
        + ". Code commits: "
        + (", ".join(f"{k} {' '.join(c[:7] for c in v)}" for k, v in commits.items()) or "—")
        + ".",
    ]
    sweeps = list(dict.fromkeys(study.sweep_of(p) for p in study.parts))
    for sweep in sweeps:
        runs = [r for r in runlib.load_sweep(root / sweep) if r.finished]
        if not runs:
            continue
        lines += ["", f"## {sweep}", "", f"{len(runs)} runs, {runlib.tokens_per_run(runs):,} tokens per run.", "",
                  *table(study, cell_rows(study, runs)), *contrasts(study, runs)]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "tables.md", "\n".join(lines) + "\n")
    print(f"wrote {out / 'tables.md'}")
