"""The `horizon` part kind of scripts/study.py and the horizon study's report (configs/study/horizon.yaml).

A horizon part trains, per (cell, setting, seed), one constant-lr trunk and a WSD cooldown branch at each
horizon (scripts/branches.py), so that one trunk gives the final loss at every horizon. Horizons are in
tokens per parameter of the part's reference cell (the same step counts for every cell of the part, so
that runs of one seed share their data order). Per cell, in order, two runs at a time:
  selection  every lr of the grid around the cell's start (`tune.width` on each side) on the study's
             `seeds`; one more ladder point where a horizon's best is at the edge (`tune.edge_rounds`);
  scalars    cells with `scalar_lr_mults`: optim.groups.scalars.lr_mult at each of them, at every best lr;
  test       at each horizon's best setting (lowest mean over the selection seeds), the part's
             `test_seeds`, fresh: the reported numbers are not those the choice was made on.
A part with `pick` runs those cells of its `of` part, the grid centred on their best lr there.
Each trunk dir holds point.json (its cell, setting, seed and role) and horizons.json (per horizon: steps,
tokens, final validation loss, training seconds): runs are read back from these, never from names.
The report compares every cell with the reference of its block by seed (paired t, Holm over each table,
TOST at +/-0.02 with +/-0.04 beside it) and writes docs/<study>/tables.md, results.jsonl and figures.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import branches
from experiments import runs as runlib
from common import children
from common.provenance import code_commit
from common.stats import MARGIN, PAPER_MARGIN, paired, parabola_optimum, summarize, three_word_verdicts
from data.files import atomic_write, read_json

REPO = Path(__file__).resolve().parent.parent
MULT_KEY = "optim.groups.scalars.lr_mult"


# --- planning --------------------------------------------------------------------------------------

def compose(overrides: list):
    """The composed Hydra config of `overrides` (configs/, the code's schema)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    from trainer.config_store import register_code_configs

    register_code_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        return hydra_compose("config", overrides=overrides)


def reference_setting(study, part: dict, experiment: str, overrides: list) -> tuple[int, int, int]:
    """(GPT.num_params(), train.batch_tokens, optim.warmup_steps) of the reference cell of the part's
    block (tokens per parameter count its parameters)."""
    from model import GPT
    from trainer.config import parse_run_config

    cell = study.reference_of(part_cells(study, part)[0])
    cfg = compose([f"experiment={experiment}", *study.overrides, *cell_overrides(study, part, cell), *overrides])
    return GPT(parse_run_config(cfg).model).num_params(), int(cfg.train.batch_tokens), int(cfg.optim.warmup_steps)


def part_cells(study, part: dict) -> list:
    return list(part.get("cells") or study.picked_names(part.get("pick", [])))


def cell_overrides(study, part: dict, cell: str) -> list:
    from sweep import fmt_value

    over = {**study.cells[cell]["overrides"], **(part.get("overrides") or {})}
    return [f"{k}={fmt_value(v)}" for k, v in over.items()]


def horizon_steps(part: dict, params: int, batch_tokens: int) -> dict:
    """tokens per parameter -> optimizer steps."""
    return {t: max(1, round(t * params / batch_tokens)) for t in part["horizons"]}


def trunk_dir(root: Path, part: dict, cell: str, lr: float, mult: float, seed: int) -> Path:
    return root / part["sweep"] / cell / (f"lr{lr:g}" + ("" if mult == 1 else f"-m{mult:g}")) / f"s{seed}"


# --- reading ---------------------------------------------------------------------------------------

def collect(root: Path, part: dict, published: Path | None = None) -> list:
    """One row per finished horizon of every trunk of the part: point.json + horizons.json; then, where
    `published` (the study's docs/<study>/results.jsonl) has rows of trunks with no run dir here, those rows,
    so that a fresh checkout resumes the study from its committed results instead of training them again."""
    rows = []
    for p in sorted((root / part["sweep"]).rglob("point.json")):
        h = p.parent / "horizons.json"
        if not h.is_file():
            continue
        point, res = read_json(p), read_json(h)
        by_steps = {int(k): v for k, v in res["horizons"].items()}
        longest = max(point["horizons"].values())
        for tpp, steps in point["horizons"].items():
            if steps in by_steps:
                r = by_steps[steps]
                rows.append({**{k: point[k] for k in ("cell", "lr", "mult", "seed", "part", "commit")},
                             "tpp": float(tpp), "steps": steps, "tokens": r["tokens"], "val_loss": r["final_val_loss"],
                             "diverged": r["diverged"] or not _finite(r["final_val_loss"]), "train_s": r["train_s"],
                             "trunk": str(p.parent)})
                if steps == longest and (p.parent / "trunk").is_dir():  # published with the row: run dirs go
                    rows[-1]["scalars"] = runlib.scalar_movement(runlib.load_run(p.parent / "trunk").stats)
    if published is not None and published.is_file():
        here = {(r["cell"], r["lr"], r["mult"], r["seed"]) for r in rows}
        for line in published.read_text().splitlines():
            r = json.loads(line)
            key = (r["cell"], r["lr"], r["mult"], r["seed"])
            if r.get("part") == part["name"] and key not in here:
                rows.append({**r, "trunk": f"{published}#{r['cell']}/lr{r['lr']:g}-m{r['mult']:g}/s{r['seed']}"})
    return rows


def published(docs: Path, study) -> Path:
    return docs / study.name / "results.jsonl"


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


def means(rows: list, cell: str, tpp: float, seeds) -> dict:
    """(lr, mult) -> mean final loss over `seeds` (a diverged run counts as +inf), where every seed ran."""
    seeds, by = set(seeds), {}
    for r in rows:
        if r["cell"] == cell and r["tpp"] == tpp and r["seed"] in seeds:
            by.setdefault((r["lr"], r["mult"]), {})[r["seed"]] = r["val_loss"] if not r["diverged"] else math.inf
    return {k: statistics.fmean(v.values()) for k, v in by.items() if set(v) == seeds}


def best_setting(rows: list, cell: str, tpp: float, seeds) -> tuple | None:
    m = means(rows, cell, tpp, seeds)
    return min(m, key=m.get) if m else None


# --- running ---------------------------------------------------------------------------------------

def run_part(runner, part: dict) -> None:
    study, args = runner.study, runner.args
    root, exp = args.runs_root, args.experiment
    centre = _centres(runner, part)  # a picking part: its cells and their grid centres from `of`
    cells = [c for c in part_cells(study, part) if c in runner.cells or c == study.reference_of(c)]
    params, batch, warmup = reference_setting(study, part, exp, args.overrides)
    steps = horizon_steps(part, params, batch)
    print(f"part {part['name']}: {params:,} parameters of the reference; horizons "
          + ", ".join(f"{t:g} tok/param = {s} steps" for t, s in steps.items()), flush=True)
    decay = float(part.get("decay_frac", 0.2))
    branches.plan(list(steps.values()), decay, warmup)
    sel, test = list(study.seeds), list(part["test_seeds"])
    pub = published(args.docs, study)
    slots = children.GpuSlots(children.visible_gpus(getattr(args, "gpus", None)), 1, args.jobs,
                              getattr(args, "oversubscribe", False))  # one GPU per trunk, never cuda:0 for all

    def trunks(points):
        done = {k for k, n in _published_counts(collect(root, part, pub)).items() if n == len(steps)}
        todo = [(c, lr, m, s, role) for c, lr, m, s, role in points
                if (c, lr, m, s) not in done and (not (trunk_dir(root, part, c, lr, m, s) / "horizons.json").is_file()
                                                  or not _complete(trunk_dir(root, part, c, lr, m, s)))]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for f in [pool.submit(_train_trunk, runner, part, steps, decay, warmup, slots, *t) for t in todo]:
                f.result()

    for cell in cells:  # cell by cell: a study stopped part-way has whole cells
        rows = lambda: [r for r in collect(root, part, pub) if r["cell"] == cell]  # noqa: E731
        lrs = study.around(centre.get(cell, study.cells[cell]["start"]))
        trunks([(cell, lr, 1.0, s, "selection") for lr in lrs for s in sel])
        for _ in range(study.edge_rounds):
            more, rs = set(), rows()
            tried = sorted({r["lr"] for r in rs if r["mult"] == 1.0})
            for t in part["horizons"]:
                b = best_setting(rs, cell, float(t), sel)
                if b and b[0] in (tried[0], tried[-1]) and len(tried) > 1:
                    nxt = study.beyond(b[0], up=b[0] == tried[-1])
                    if nxt is not None and nxt not in tried:
                        more.add(nxt)
            if not more:
                break
            trunks([(cell, lr, 1.0, s, "selection") for lr in sorted(more) for s in sel])
        mults = [float(m) for m in study.cells[cell].get("scalar_lr_mults", [])]
        if mults:
            rs = rows()
            best_lrs = {best_setting(rs, cell, float(t), sel)[0] for t in part["horizons"]}
            trunks([(cell, lr, m, s, "selection") for lr in sorted(best_lrs) for m in mults if m != 1.0 for s in sel])
        rs = rows()
        settings = {best_setting(rs, cell, float(t), sel) for t in part["horizons"]}
        trunks([(cell, lr, m, s, "test") for lr, m in sorted(settings) for s in test])
        print(f"### cell {cell} done", flush=True)


def _centres(runner, part: dict) -> dict:
    """A picking part's grid centre per cell: its best lr at the part's horizon in `of` (selection seeds)."""
    if "of" not in part:
        return {}
    of = runner.study.part(part["of"])
    rows = collect(runner.args.runs_root, of, published(runner.args.docs, runner.study))
    out = {}
    for item in part.get("pick", []):
        names = item["best_of"] if isinstance(item, dict) else [item]
        t = float(part["horizons"][-1])
        scored = {c: min(means(rows, c, t, runner.study.seeds).values(), default=math.inf) for c in names}
        for c in names:
            b = best_setting(rows, c, t, runner.study.seeds)
            if b:
                out[c] = b[0]
        keep = min(scored, key=scored.get) if isinstance(item, dict) else item
        cells = part.setdefault("cells", [])
        if keep not in cells:
            cells.append(keep)
    return out


def _published_counts(rows: list) -> dict:
    """(cell, lr, mult, seed) -> horizons recorded in the published results (rows with no run dir here)."""
    out = {}
    for r in rows:
        if "#" in r["trunk"]:
            k = (r["cell"], r["lr"], r["mult"], r["seed"])
            out[k] = out.get(k, 0) + 1
    return out


def _complete(d: Path) -> bool:
    res = read_json(d / "horizons.json")
    point = read_json(d / "point.json")
    return len(res["horizons"]) == len(point["horizons"])


def _train_trunk(runner, part, steps, decay, warmup, slots, cell, lr, mult, seed, role) -> None:
    if children.stopped():  # a queued trunk after Ctrl-C / SIGTERM: start nothing, leave no empty run dir
        raise children.Stopped(children.stopped())
    study, args = runner.study, runner.args
    out = trunk_dir(args.runs_root, part, cell, lr, mult, seed)
    out.mkdir(parents=True, exist_ok=True)
    point = {"cell": cell, "lr": lr, "mult": mult, "seed": seed, "role": role, "part": part["name"],
             "horizons": {f"{t:g}": s for t, s in steps.items()}, "decay_frac": decay,
             "commit": code_commit(REPO) or "unknown"}
    if (out / "point.json").is_file():  # a resumed trunk keeps the commit it started with
        point["commit"] = read_json(out / "point.json").get("commit", point["commit"])
    atomic_write(out / "point.json", json.dumps(point, indent=1) + "\n")
    overrides = [f"experiment={args.experiment}", *study.overrides, *cell_overrides(study, part, cell),
                 f"optim.lr={lr:g}", f"{MULT_KEY}={mult:g}", f"train.seed={seed}", *args.overrides]
    t0 = time.time()
    print(f"# {cell} lr={lr:g} mult={mult:g} seed={seed} ({role}) -> {out}", flush=True)
    slot, env = slots.acquire()
    try:
        branches.run(out, list(steps.values()), decay, overrides, warmup, log=out / "train.log", env=env)
    except RuntimeError as e:  # a failed trunk (e.g. diverged past recovery) is recorded, the study goes on
        print(f"! {e}", flush=True)
        return
    finally:
        slots.release(slot)
    print(f"# done {cell} lr={lr:g} mult={mult:g} seed={seed}: {time.time() - t0:.0f} s", flush=True)


# --- the report ------------------------------------------------------------------------------------

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
             "run dirs; every number below is a final validation loss (nats per byte) of a WSD run.", "",
             corpus_line(experiment), ""]
    parts = {p["name"]: collect(root, p, published(docs, study)) for p in study.parts if p["kind"] == "horizon"}
    all_rows = [r for rows in parts.values() for r in rows]
    for part in study.parts:
        if part["name"] in parts:
            lines += part_tables(study, part, parts[part["name"]])
    times = runlib.study_times(root, study.name)
    if times:  # runs/ of this checkout only: each part's line above has the training time of every trunk
        lines += ["## Wall time", "", "Of the invocations whose run dirs this checkout holds (earlier checkouts' "
                  "wall time is not kept; each part's line above sums the training time of all its trunks).", "",
                  "| part | wall |", "|---|---|"]
        lines += [f"| {p} | {s / 3600:.2f} h |" for p, s in times.items()] + [""]
    atomic_write(d / "tables.md", "\n".join(lines) + "\n")
    atomic_write(d / "results.jsonl", "".join(json.dumps({k: v for k, v in r.items() if k != "trunk"}) + "\n"
                                              for r in all_rows))
    for part in study.parts:
        if part["name"] in parts:
            figure(study, part, parts[part["name"]], d / f"{part['name']}_gap.png")
    print(f"wrote {d / 'tables.md'}")


def part_tables(study, part: dict, rows: list) -> list:
    name = part["name"]
    if not rows:
        return [f"## Part {name}: not run yet", ""]
    res = analyse(study, part, rows)
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
        f"(trunk + branches: {cost:.2f}x "
        f"the longest run per trunk); code {', '.join(commits)}.",
        "",
    ]
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
            out.append(f"| {c} | {e['setting'][0]:g}{flag} | {e['setting'][1]:g} | {vx} | "
                       f"{e['selection_mean']:.4f} | {', '.join(f'{v:.4f}' for v in tv) or 'not run'} | "
                       + (f"{s.mean:.4f} {s.ci(4)}" if s.mean is not None else "—") + " | "
                       + (f"{pc.mean:+.4f} {pc.ci(4)}" if pc else ("reference" if c == study.reference_of(c) else "—"))
                       + f" | {e.get('verdict', '—')} | "
                       + (f"{pc.p_equiv[PAPER_MARGIN]:.2g}" if pc and pc.p_equiv.get(PAPER_MARGIN) is not None else "—")
                       + " |")
        out.append("")
    out += scalar_table(study, part, rows, res)
    return out


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


def figure(study, part: dict, rows: list, path: Path) -> None:
    """The paired gap to the reference against horizon, with its 95% CI, one line per cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from data.files import atomic_open

    res = analyse(study, part, rows)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    cells = sorted({c for e in res.values() for c, v in e.items() if v.get("paired")})
    for c in cells:
        pts = [
            (t, e[c]["paired"])
            for t, e in res.items()
            if c in e and e[c].get("paired") and e[c]["paired"].lo is not None
        ]
        if not pts:
            continue
        xs = [t for t, _ in pts]
        ax.errorbar(
            xs,
            [p.mean for _, p in pts],
            yerr=[[p.mean - p.lo for _, p in pts], [p.hi - p.mean for _, p in pts]],
            marker="o",
            capsize=3,
            label=c,
        )
    ax.axhline(0, color="k", lw=0.8)
    for m in (MARGIN, PAPER_MARGIN):
        ax.axhspan(-m, m, color="grey", alpha=0.08)
    ax.set_xscale("log")
    ax.set_xlabel("tokens per parameter")
    ax.set_ylabel("final val loss − reference (paired by seed)")
    ax.set_title(f"part {part['name']}: gap against horizon (95% CI; bands ±0.02, ±0.04)", fontsize=9)
    if cells:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, dpi=110, format="png")
    plt.close(fig)
