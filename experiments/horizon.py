"""The `horizon` part kind of a study (experiments/study.py); the horizon study's report is studies/horizon/.

A horizon part trains, per (cell, setting, seed), one constant-lr trunk and a WSD cooldown branch at each
horizon (experiments/branches.py), so that one trunk gives the final loss at every horizon. Horizons are in
tokens per parameter of the part's reference cell (the same step counts for every cell of the part, so
that runs of one seed share their data order). Per cell, in order, `--jobs` runs at a time (a slot that one
cell leaves idle while it waits for its last trunk goes to the next cell's trunks):
  selection  every lr of the grid around the cell's start (`tune.width` on each side) on the study's
             `seeds`; one more ladder point where a horizon's best is at the edge, at most
             `tune.edge_rounds` beyond the grid on each side (counted per cell from what it has tried, so
             that a study resumed mid-cell brackets it as an unbroken one would);
  scalars    cells with `scalar_lr_mults`: optim.groups.scalars.lr_mult at each of them, at every best lr;
             one more multiplier step up where a horizon's best is at the largest tried (at most
             `tune.edge_rounds` beyond the declared ones);
             then the lr bracketed at a chosen multiplier above 1 as at x 1 (its ladder neighbours there);
  test       at each horizon's best setting (lowest mean over the selection seeds), the part's
             `test_seeds`, fresh: the reported numbers are not those the choice was made on. A part with a
             `primary_horizon` tests at that horizon's best setting only; its other horizons are read from
             the same test trunks (secondary readings at a setting chosen for the primary horizon).
A part with `pick` runs those cells of its `of` part, the grid centred on their best lr there.
Each trunk dir holds point.json (its cell, setting, seed, role, and `segments`: the [start, end] Unix times of
each invocation that trained it) and horizons.json (per horizon: steps, tokens, final validation loss, training
seconds): runs are read back from these, never from names.
The finished results are published in docs/<study>/results.jsonl (`collect`), so a fresh checkout resumes
from them without the run dirs.
"""
from __future__ import annotations

import functools
import json
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import children
from common.errors import UserError
from experiments import branches
from experiments import runs as runlib
from common.provenance import code_commit
from data.files import atomic_write, read_json

REPO = Path(__file__).resolve().parent.parent
MULT_KEY = "optim.groups.scalars.lr_mult"
# what horizons.json records per run beyond the loss, published with each row where present (runs made before
# bits per byte and whole-split final evaluations have none of these)
ROW_EXTRAS = ("final_val_bpb", "final_val_se_bpb", "final_val_tokens", "spikes_loss", "spikes_grad_norm",
              "max_grad_norm")
# A slot a cell's trunk frees is kept for that cell this long before the next cell may take it: its other trunk
# of the phase ends within seconds, or its next phase is being planned (a few seconds of reading results).
HOLD_S = 120.0


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
    from experiments.sweep import fmt_value

    over = {**study.cells[cell]["overrides"], **(part.get("overrides") or {})}
    return [f"{k}={fmt_value(v)}" for k, v in over.items()]


def horizon_steps(part: dict, params: int, batch_tokens: int) -> dict:
    """tokens per parameter -> optimizer steps."""
    return {t: max(1, round(t * params / batch_tokens)) for t in part["horizons"]}


def trunk_dir(root: Path, part: dict, cell: str, lr: float, mult: float, seed: int) -> Path:
    return root / part["sweep"] / cell / (f"lr{lr:g}" + ("" if mult == 1 else f"-m{mult:g}")) / f"s{seed}"


# --- reading ---------------------------------------------------------------------------------------

def collect(root: Path, part: dict, published: Path | None = None, sharing: tuple = ()) -> list:
    """One row per finished horizon of every trunk of the part: point.json + horizons.json; then, where
    `published` (the study's docs/<study>/results.jsonl) has rows of trunks with no run dir here, those rows,
    so that a fresh checkout resumes the study from its committed results instead of training them again.
    `sharing`: the other parts that write the same sweep (their trunks are this part's where a cell is in both,
    as m16's Pre-LN is p16's); their published rows count too."""
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
                             **{k: r[k] for k in ROW_EXTRAS if r.get(k) is not None},
                             **_doc_nats(r.get("run_dir")), "trunk": str(p.parent)})
                if point.get("segments"):
                    rows[-1]["segments"] = point["segments"]
                if steps == longest and (p.parent / "trunk").is_dir():  # published with the row: run dirs go
                    rows[-1]["scalars"] = _scalars(p.parent / "trunk")
    if published is not None and published.is_file():
        here = {(r["cell"], r["lr"], r["mult"], r["seed"]) for r in rows}
        for line in published.read_text().splitlines():
            r = json.loads(line)
            key = (r["cell"], r["lr"], r["mult"], r["seed"])
            if (r.get("part") == part["name"] or r.get("part") in sharing) and key not in here:
                rows.append({**r, "trunk": f"{published}#{r['cell']}/lr{r['lr']:g}-m{r['mult']:g}/s{r['seed']}"})
    return rows


def _doc_nats(run_dir) -> dict:
    """{"doc_nats": [...]}: the run's final evaluation per validation document (final_eval.json), rounded to
    1e-4 nats, so that a published row still gives the validation set's own standard error; {} without it."""
    f = Path(run_dir) / "final_eval.json" if run_dir else None
    if f is None or not f.is_file():
        return {}
    return {"doc_nats": [round(v, 4) for v in read_json(f)["docs"]["nats"]]}


def _scalars(trunk: Path) -> dict:
    """The learned scalars' movement over a finished trunk (its metrics read once per version of the file:
    a study plans every phase of every cell from `collect`)."""
    return _scalars_of(str(trunk), (trunk / "metrics.jsonl").stat().st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _scalars_of(trunk: str, _mtime_ns: int) -> dict:
    return runlib.scalar_movement(runlib.load_run(Path(trunk)).stats)


def sharing_parts(study, part: dict) -> tuple:
    """The names of the other parts that write the same sweep (run-dir group) as `part`."""
    return tuple(p["name"] for p in study.parts if p is not part and study.sweep_of(p) == study.sweep_of(part))


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


def _room(tried, start, up: bool, rounds: int) -> bool:
    """Whether a cell may add one more point beyond `start` (its starting values) on one side: fewer than
    `rounds` of the values it has tried lie beyond them there."""
    beyond = [v for v in tried if (v > max(start) if up else v < min(start))]
    return len(beyond) < rounds


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
    sharing = sharing_parts(study, part)
    slots = children.GpuSlots(children.visible_gpus(getattr(args, "gpus", None)), 1, args.jobs,  # one GPU per trunk
                              getattr(args, "oversubscribe", False), hold_s=HOLD_S)

    def trunks(points, priority):
        done = {k for k, n in _published_counts(collect(root, part, pub, sharing)).items() if n == len(steps)}
        todo = [(c, lr, m, s, role) for c, lr, m, s, role in points
                if (c, lr, m, s) not in done and (not (trunk_dir(root, part, c, lr, m, s) / "horizons.json").is_file()
                                                  or not _complete(trunk_dir(root, part, c, lr, m, s)))]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(_train_trunk, runner, part, steps, decay, warmup, slots, priority, *t)
                       for t in todo]
            failed = [why for why in (f.result() for f in futures) if why]
        if failed:  # the cell's next phase would choose from part of its bracket: it stops here
            raise TrunkFailed(f"study cell {todo[0][0]}: {len(failed)} of {len(todo)} trunks failed, so the cell "
                              f"stopped before its next phase (rerun to retry them); first: {failed[0]}")

    def run_cell(i: int, cell: str) -> None:
        rows = lambda: [r for r in collect(root, part, pub, sharing) if r["cell"] == cell]  # noqa: E731
        lrs = study.around(centre.get(cell, (part.get("starts") or {}).get(cell, study.cells[cell]["start"])))
        trunks([(cell, lr, 1.0, s, "selection") for lr in lrs for s in sel], i)
        # Edge points are counted per cell from what it has tried (at most `edge_rounds` beyond its starting
        # grid on each side), so a study stopped and resumed mid-cell brackets it exactly as one unbroken run.
        while True:
            more, rs = set(), rows()
            tried = sorted({r["lr"] for r in rs if r["mult"] == 1.0})
            for t in part["horizons"]:
                b = best_setting(rs, cell, float(t), sel)
                if b and b[0] in (tried[0], tried[-1]) and len(tried) > 1:
                    up = b[0] == tried[-1]
                    nxt = study.beyond(b[0], up=up)
                    if nxt is not None and nxt not in tried and _room(tried, lrs, up, study.edge_rounds):
                        more.add(nxt)
            if not more:
                break
            trunks([(cell, lr, 1.0, s, "selection") for lr in sorted(more) for s in sel], i)
        mults = sorted(float(m) for m in study.cells[cell].get("scalar_lr_mults", []))
        if mults:
            rs = rows()
            # the lrs the scalar axis is tried at: each horizon's best at x 1 (from the x 1 runs alone, so a
            # multiplier's runs never move them)
            x1 = [r for r in rs if r["mult"] == 1.0]
            best_lrs = {best_setting(x1, cell, float(t), sel)[0] for t in part["horizons"]}
            trunks([(cell, lr, m, s, "selection") for lr in sorted(best_lrs) for m in mults if m != 1.0
                    for s in sel], i)
            # The multiplier is bracketed too: a best at the largest multiplier tried at its lr gets one more
            # step up (the ladder's last ratio), so a method whose scalars want to move faster is not capped.
            ratio = mults[-1] / mults[-2] if len(mults) > 1 else 10.0
            while True:
                rs = rows()
                more = set()
                for t in part["horizons"]:
                    lr, m = best_setting(rs, cell, float(t), sel)
                    at_lr = sorted({r["mult"] for r in rs if r["lr"] == lr})
                    if m > 1.0 and m == at_lr[-1] and _room(at_lr, mults, True, study.edge_rounds):
                        more.add((lr, m * ratio))
                if not more:
                    break
                trunks([(cell, lr, m, s, "selection") for lr, m in sorted(more) for s in sel], i)
            # ... and the lr at a chosen multiplier above 1, like the lr at x 1: where it is the only lr tried
            # there or at the edge of those, its ladder neighbours at that multiplier
            while True:
                rs = rows()
                more = set()
                for t in part["horizons"]:
                    lr, m = best_setting(rs, cell, float(t), sel)
                    tried = sorted({r["lr"] for r in rs if r["mult"] == m})
                    if m == 1.0:
                        continue
                    for up in (False, True):
                        if lr == (tried[-1] if up else tried[0]):
                            nxt = study.beyond(lr, up=up)
                            room = _room(tried, best_lrs, up, study.edge_rounds)
                            if nxt is not None and nxt not in tried and room:
                                more.add((nxt, m))
                if not more:
                    break
                trunks([(cell, lr, m, s, "selection") for lr, m in sorted(more) for s in sel], i)
        rs = rows()
        # a part with a primary horizon tests at that horizon's choice only (the shorter horizons are read from
        # the same test trunks' branches); otherwise each horizon's choice is tested
        tested = [part["primary_horizon"]] if "primary_horizon" in part else part["horizons"]
        settings = {best_setting(rs, cell, float(t), sel) for t in tested}
        trunks([(cell, lr, m, s, "test") for lr, m in sorted(settings) for s in test], i)
        print(f"### cell {cell} done", flush=True)

    # Every cell is planned at once, and its trunks wait for a slot with the cell's rank as priority: the
    # first cell gets every slot it can use, and a slot it leaves idle (its third test seed, a phase waiting
    # for its last trunk) goes to the next cell's trunks instead of waiting. A stopped study has its first
    # cells whole, and at most a few trunks of the next.
    with ThreadPoolExecutor(max_workers=max(1, len(cells))) as pool:
        def cell_then_free(i: int, cell: str) -> None:
            try:
                run_cell(i, cell)
            except TrunkFailed as e:
                print(f"### cell {cell} stopped: {e}", flush=True)
                raise
            finally:
                slots.finished(i)   # its held slots go to the next cells at once
        futures = [pool.submit(cell_then_free, i, c) for i, c in enumerate(cells)]
        errors = [f.exception() for f in futures]
    stops = [e for e in errors if isinstance(e, children.Stopped)]
    for e in [e for e in errors if e is not None and not isinstance(e, children.Stopped)] + stops:
        raise e


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


class TrunkFailed(UserError):
    """A cell's trunk exited with an error (not a divergence, which is a result): the study goes on with
    the other cells and ends with this line."""


def _train_trunk(runner, part, steps, decay, warmup, slots, priority, cell, lr, mult, seed, role) -> str | None:
    """Train one trunk and its branches; the error's line if train.py failed, else None."""
    if children.stopped():  # a queued trunk after Ctrl-C / SIGTERM: start nothing, leave no empty run dir
        raise children.Stopped(children.stopped())
    study, args = runner.study, runner.args
    out = trunk_dir(args.runs_root, part, cell, lr, mult, seed)
    slot, env = slots.acquire(priority)  # waits (a stop meanwhile raises Stopped): the run dir only once it runs
    point, t0 = None, time.time()
    try:
        out.mkdir(parents=True, exist_ok=True)
        point = {"cell": cell, "lr": lr, "mult": mult, "seed": seed, "role": role, "part": part["name"],
                 "horizons": {f"{t:g}": s for t, s in steps.items()}, "decay_frac": decay,
                 "commit": code_commit(REPO) or "unknown", "segments": []}
        if (out / "point.json").is_file():  # a resumed trunk keeps the commit it started with, and its segments
            old = read_json(out / "point.json")
            point["commit"], point["segments"] = old.get("commit", point["commit"]), old.get("segments", [])
        atomic_write(out / "point.json", json.dumps(point, indent=1) + "\n")
        overrides = [f"experiment={args.experiment}", *study.overrides, *cell_overrides(study, part, cell),
                     f"optim.lr={lr:g}", f"{MULT_KEY}={mult:g}", f"train.seed={seed}", *args.overrides]
        print(f"# {cell} lr={lr:g} mult={mult:g} seed={seed} ({role}) -> {out}", flush=True)
        branches.run(out, list(steps.values()), decay, overrides, warmup, log=out / "train.log", env=env)
    except RuntimeError as e:  # a crash, not a result: the cell's caller stops it after this phase
        print(f"! {e}", flush=True)
        return str(e)
    finally:
        slots.release(slot)
        if point is not None:  # the time this trunk held a slot, stopped or not: a part's wall time is their union
            point["segments"].append([round(t0, 1), round(time.time(), 1)])
            atomic_write(out / "point.json", json.dumps(point, indent=1) + "\n")
    print(f"# done {cell} lr={lr:g} mult={mult:g} seed={seed}: {time.time() - t0:.0f} s", flush=True)
    return None
