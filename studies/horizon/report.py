"""The horizon study's report (studies/horizon/study.yaml): per horizon, each cell's selected setting and
fresh test seeds against the reference of its block, paired by seed (paired t, Holm over each table, TOST
at +/-0.02 with +/-0.04 beside it); the learned scalars' movement; docs/<study>/tables.md, results.jsonl
and a figure per part."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from common.stats import (MARGIN, PAPER_MARGIN, interaction, paired, parabola_optimum, summarize,
                          three_word_verdicts)
from data.files import atomic_open, atomic_write, read_json
from experiments import branches
from experiments.horizon import best_setting, collect, compose, means, published


def corpus_line(experiment: str) -> str:
    from data.config import DataConfig

    cfg = compose([f"experiment={experiment}"])
    out = DataConfig.from_any(cfg.data).out_dir
    meta_path = out / "meta.json"
    if not meta_path.is_file():
        return f"Corpus: {cfg.data.name} (not prepared on this checkout: {out})."
    meta = read_json(meta_path)
    info, sp = meta["source"].get("stream0", {}), meta["splits"]
    return (f"Corpus: `{meta['name']}` ({meta['tokenizer']} tokenizer), {sp['train']['documents']:,} training files "
            f"({sp['train']['tokens']:,} tokens) and {sp['val']['documents']:,} validation files "
            f"({sp['val']['tokens']:,} tokens), split by file; {len(info.get('composition', []))} sources "
            f"(the stdlib of Python {info.get('python', '?')} and the installed packages), sha256 "
            f"`{info.get('sha256', '?')}`.")


def analyse(study, part: dict, rows: list) -> dict:
    """Per horizon: each cell's selected setting, test values by seed, and the paired comparison with
    its block's reference, verdicts Holm-corrected over the horizon's table."""
    out = {}
    sel, test = list(study.seeds), list(part["test_seeds"])
    cells = sorted({r["cell"] for r in rows}, key=lambda c: list(study.cells).index(c))
    for t in part["horizons"]:
        t = float(t)
        entries = {}
        for c in cells:
            b = best_setting(rows, c, t, sel)
            if b is None:
                continue
            grid = {lr: v for (lr, m), v in means(rows, c, t, sel).items() if m == 1.0}  # the lr grid
            vertex = parabola_optimum(list(grid), list(grid.values())) if len(grid) >= 3 else None
            tv = {r["seed"]: (r["val_loss"] if not r["diverged"] else math.inf) for r in rows
                  if r["cell"] == c and r["tpp"] == t and (r["lr"], r["mult"]) == b and r["seed"] in test}
            entries[c] = {"setting": b, "selection_mean": means(rows, c, t, sel)[b], "grid": grid,
                          "vertex": vertex, "test": tv, "edge": len(grid) > 1 and b[0] in (min(grid), max(grid))}
        comps, names, keys = [], [], []
        for c, e in entries.items():
            ref = study.reference_of(c)
            if c == ref or ref not in entries or len(e["test"]) < 2:
                continue
            finite = {s: v for s, v in e["test"].items() if math.isfinite(v)}
            comps.append(paired(finite, entries[ref]["test"]))
            names.append((c, ref))
            keys.append(c)
        for c, comp, v in zip(keys, comps, three_word_verdicts(comps, names)):
            entries[c]["paired"], entries[c]["verdict"] = comp, v
        out[t] = entries
    return out


def report(study, root: Path, docs: Path, experiment: str) -> None:
    d = docs / study.name
    d.mkdir(parents=True, exist_ok=True)
    lines = [f"# {study.name} study: tables", "", "Written by `python scripts/study.py horizon --report` from the "
             "run dirs and the rows already published beside it; every number below is a final validation loss "
             "(nats per byte) of a WSD run.", "",
             corpus_line(experiment), ""]
    parts = {p["name"]: collect(root, p, published(docs, study)) for p in study.parts if p["kind"] == "horizon"}
    all_rows = [r for rows in parts.values() for r in rows]
    # a part run on cells of another (`of`, e.g. one width up) is read beside that part's analysis
    of = {p["name"]: next((o for o in study.parts if o["name"] == p.get("of") and parts.get(o["name"])), None)
          for p in study.parts}
    res = {p["name"]: analyse(study, p, parts[p["name"]]) for p in study.parts if parts.get(p["name"])}
    of_res = {n: res[o["name"]] if o else None for n, o in of.items()}
    for part in study.parts:
        if part["name"] in parts:
            n = part["name"]
            lines += part_tables(study, part, parts[n], res.get(n, {}), of[n], of_res[n])
    atomic_write(d / "tables.md", "\n".join(lines) + "\n")
    atomic_write(d / "results.jsonl", "".join(json.dumps({k: v for k, v in r.items() if k != "trunk"}) + "\n"
                                              for r in all_rows))
    for part in study.parts:
        if part["name"] in parts:
            n = part["name"]
            figure(study, part, res.get(n, {}), d / f"{n}_gap.png", of[n], of_res[n])
    print(f"wrote {d / 'tables.md'}")


def part_tables(study, part: dict, rows: list, res: dict, of: dict | None = None, of_res: dict | None = None) -> list:
    """The part's tables from its rows and their analysis (`analyse`); `of`/`of_res`: the part it repeats."""
    name = part["name"]
    if not rows:
        return [f"## Part {name}: not run yet", ""]
    trunks = {r["trunk"] for r in rows}
    tokens = {float(t): max(r["tokens"] for r in rows if r["tpp"] == float(t)) for t in part["horizons"]
              if any(r["tpp"] == float(t) for r in rows)}
    train_s = sum((r["train_s"] or 0) for r in rows)
    commits = sorted({r["commit"] for r in rows})
    cost = branches.cost(branches.plan(sorted({r["steps"] for r in rows}), part.get("decay_frac", 0.2)))
    out = [
        f"## Part {name}",
        "",
        f"{len(trunks)} trunks, {len(rows)} horizon results; tokens per run: "
        + ", ".join(f"{t:g} tok/param = {n:,}" for t, n in tokens.items())
        + f"; selection seeds {study.seeds}, test seeds {part['test_seeds']}; training time {train_s / 3600:.2f} h "
        f"summed over runs (trunk + branches: {cost:.2f}x "
        f"the longest run per trunk); code {', '.join(commits)}.",
        "",
    ]
    out += glance_table(study, part, res)
    if of_res:
        out += against_table(study, part, res, of, of_res)
    for t, entries in res.items():
        if not entries:
            continue
        out += [f"### {name}: {t:g} tokens per parameter", "",
                "| cell | best lr (grid) | scalar lr_mult | parabola lr | selection mean | test per seed | test mean "
                "[95% CI] | − reference, paired [95% CI] | verdict (Holm; TOST ±0.02) | TOST ±0.04 p |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for c, e in entries.items():
            tv = [e["test"][s] for s in sorted(e["test"])]
            s = summarize([v for v in tv if math.isfinite(v)])
            pc = e.get("paired")
            vx = f"{e['vertex'][0]:.2g}" if e["vertex"] else ("edge" if e["edge"] else "—")
            flag = f" (grid incomplete: {len(e['grid'])} lr)" if len(e["grid"]) < 3 else " (edge)" if e["edge"] else ""
            ref = "reference" if c == study.reference_of(c) else "—"
            tost = pc.p_equiv.get(PAPER_MARGIN) if pc else None
            out.append(f"| {c} | {e['setting'][0]:g}{flag} | {e['setting'][1]:g} | {vx} | "
                       f"{e['selection_mean']:.4f} | {', '.join(f'{v:.4f}' for v in tv) or 'not run'} | "
                       + (f"{s.mean:.4f} {s.ci(4)}" if s.mean is not None else "—") + " | "
                       + (f"{pc.mean:+.4f} {pc.ci(4)}" if pc else ref)
                       + f" | {e.get('verdict', '—')} | "
                       + (f"{tost:.2g}" if tost is not None else "—") + " |")
        out.append("")
    out += scalar_table(study, part, rows, res)
    return out


def crossings(gaps: dict) -> str:
    """Where a cell's mean gap to the reference changes sign between consecutive horizons (of the means:
    whether a crossing is real is each horizon's verdict, not this)."""
    ts = sorted(gaps)
    if not ts:
        return "—"
    sign = {t: "+" if gaps[t] > 0 else "-" for t in ts}
    changes = [f"{a:g}-{b:g} ({sign[a]} to {sign[b]})" for a, b in zip(ts, ts[1:]) if sign[a] != sign[b]]
    return ", ".join(changes) if changes else f"none ({sign[ts[0]]} at every horizon)"


def gap_text(c: str, pc, v) -> str:
    """A paired gap with its interval and the verdict's word: "-0.050 [-0.060, -0.040]: ahead (p=0.01)"."""
    word = {"ahead": "ahead" if v.winner == c else "reference ahead",
            "equivalent": f"equivalent within ±{v.margin:g}"}.get(v.word, v.word)
    p = v.p_equiv if v.word == "equivalent" else v.p
    return f"{pc.mean:+.3f} {pc.ci(3)}: {word}" + (f" (p={p:.2g})" if p is not None else "")


def against_table(study, part: dict, res: dict, of: dict, of_res: dict) -> list:
    """A part run on cells of another (`of`, e.g. one width up): each cell's gap in both at the horizons they
    share, and whether the gap differs between them. The parts' inits differ, so the per-seed gaps are not
    paired across them: Welch's test on the two sets of per-seed gaps (no Holm: one question per row)."""
    a, b = of["name"], part["name"]
    changed = ", ".join(f"{k}={v}" for k, v in (part.get("overrides") or {}).items()) or "its own settings"
    out = [f"### {b} against {a}: does each gap hold? ({b} is {a} with {changed}; the parts' inits differ, so "
           "their per-seed gaps are compared by Welch's test, not paired)", "",
           f"| cell | tok/param | gap in {a} | gap in {b} | {b} − {a} [95% CI], Welch p |", "|---|---|---|---|---|"]
    any_row = False
    for t in (float(h) for h in part["horizons"]):
        for c, e in res.get(t, {}).items():
            o = of_res.get(t, {}).get(c, {})
            if not e.get("paired") or not o.get("paired"):
                continue
            d, lo, hi, p = interaction(e["paired"], o["paired"])
            ci = "—" if lo is None else f"[{lo:+.3f}, {hi:+.3f}]"
            out.append(f"| {c} | {t:g} | {gap_text(c, o['paired'], o['verdict'])} | "
                       f"{gap_text(c, e['paired'], e['verdict'])} | {d:+.3f} {ci}"
                       + (f", p={p:.2g}" if p is not None else "") + " |")
            any_row = True
    return out + [""] if any_row else []


def glance_table(study, part: dict, res: dict) -> list:
    """One row per cell: its paired gap to the reference at every horizon with the verdict's word, and
    where the means change sign (the per-horizon tables below hold the numbers behind each entry)."""
    hs = [float(t) for t in part["horizons"]]
    cells = [c for c in dict.fromkeys(c for t in hs for c in res.get(t, {})) if c != study.reference_of(c)]
    if not any(res.get(t, {}).get(c, {}).get("paired") for c in cells for t in hs):
        return []
    out = [f"### {part['name']}: at a glance (each cell − the reference of its block, paired by seed on the test "
           "seeds; the word is the Holm-corrected verdict of that horizon's table)", "",
           "| cell | " + " | ".join(f"{t:g} tok/param" for t in hs) + " | sign of the mean gap changes |",
           "|---|" + "---|" * (len(hs) + 1)]
    for c in cells:
        gaps, row = {}, []
        for t in hs:
            e = res.get(t, {}).get(c, {})
            pc, v = e.get("paired"), e.get("verdict", "")
            if not pc or pc.mean is None:
                row.append("not tested")
                continue
            gaps[t] = pc.mean
            row.append(gap_text(c, pc, v))
        out.append(f"| {c} | " + " | ".join(row) + f" | {crossings(gaps)} |")
    return out + [""]


def scalar_table(study, part: dict, rows: list, res: dict) -> list:
    """How far each cell's learned scalars moved over its longest trunk at the longest horizon's best
    setting (test seeds, else selection seeds): the largest |last - first| of each kind."""
    t = float(part["horizons"][-1])
    out = [f"### {part['name']}: learned scalars over the longest trunk ({t:g} tokens per parameter)", "",
           "| cell | setting (lr, lr_mult) | kind: first -> last (largest change), mean over seeds |", "|---|---|---|"]
    any_row = False
    for c, e in res.get(t, {}).items():
        # each trunk's movement, as its longest horizon's row carries it (also in the published results)
        at = [r for r in rows if r["cell"] == c and (r["lr"], r["mult"]) == e["setting"] and r["tpp"] == t]
        moves = [r["scalars"] for r in at if r.get("scalars")]
        if not moves:
            if any("scalars" not in r for r in at):  # rows published before the movement was
                out.append(f"| {c} | {e['setting'][0]:g}, {e['setting'][1]:g} | not recorded (its run dirs were "
                           "not kept) |")
                any_row = True
            continue
        any_row = True
        kinds = sorted(set.intersection(*(set(m) for m in moves)))
        cell_txt = "; ".join(f"{k}: {statistics.fmean(m[k]['first'] for m in moves):.3g} -> "
                             f"{statistics.fmean(m[k]['last'] for m in moves):.3g} "
                             f"({statistics.fmean(m[k]['max_abs_change'] for m in moves):.3g})" for k in kinds)
        out.append(f"| {c} | {e['setting'][0]:g}, {e['setting'][1]:g} | {cell_txt} |")
    return out + [""] if any_row else []


def figure(study, part: dict, res: dict, path: Path, of: dict | None = None, of_res: dict | None = None) -> None:
    """The paired gap to the reference against horizon, with its 95% CI, one line per cell (none before a
    cell has test seeds beside its reference's); a part run on cells of another (`of`) shows those cells'
    gaps there too, hollow, at the horizons both ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({c for e in res.values() for c, v in e.items() if v.get("paired")})
    if not cells:  # no cell tested against its reference yet: no figure, and none left from an earlier report
        path.unlink(missing_ok=True)
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    means = []
    color = {c: f"C{i % 10}" for i, c in enumerate(cells)}
    lines = [(c, res, c + (f" (part {part['name']})" if of_res else ""), "full") for c in cells]
    if of_res:  # the same cells in the part this one repeats, hollow, at the horizons this one ran
        hs = set(res)
        lines += [(c, {t: e for t, e in of_res.items() if t in hs}, f"{c} (part {of['name']})", "none")
                  for c in cells]
    for i, (c, r, label, fill) in enumerate(lines):
        pts = [(t, e[c]["paired"]) for t, e in r.items()
               if c in e and e[c].get("paired") and e[c]["paired"].lo is not None]
        if not pts:
            continue
        means += [p.mean for _, p in pts]
        # a small multiplicative offset per line on the log axis, so that overlapping intervals stay apart
        xs = [t * 10 ** (0.012 * (i - (len(lines) - 1) / 2)) for t, _ in pts]
        ax.errorbar(xs, [p.mean for _, p in pts],
                    yerr=[[p.mean - p.lo for _, p in pts], [p.hi - p.mean for _, p in pts]],
                    marker="o", fillstyle=fill, color=color[c], capsize=3, label=label)
    ax.axhline(0, color="k", lw=0.8)
    for m in (MARGIN, PAPER_MARGIN):
        ax.axhspan(-m, m, color="grey", alpha=0.08)
    ax.set_xscale("log")
    hs = [float(t) for t in part["horizons"]]
    ax.set_xlim(min(hs) / 1.5, max(hs) * 1.5)  # one horizon alone would otherwise fill the axis with the offsets
    ax.set_xticks(hs, [f"{t:g}" for t in hs])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    if means:  # frame the means: a seed-split cell's interval (±1 nat) would flatten every other line
        lo, hi = min(means + [-0.04]), max(means + [0.04])
        pad = max(0.1, 0.15 * (hi - lo))
        ax.set_ylim(lo - pad, hi + pad)
    ax.set_xlabel("tokens per parameter")
    ax.set_ylabel("final val loss − reference (paired by seed)")
    ax.set_title(f"part {part['name']}: gap against horizon (95% CI, cut at the frame; bands ±0.02, ±0.04)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)
