"""The horizon16 study's report (studies/horizon16/study.yaml): every final loss in bits per byte of the whole
validation split; at each part's primary horizon its declared Holm families (`primary`, `ablation`), each
comparison paired by seed with a 95% t interval, the gap as a percentage of the reference, Holm over the
family, TOST at +/-BPB_MARGIN, and the validation set's own standard error of the gap (clustered by
document) beside the seed spread; the other horizons as secondary readings. Writes docs/<study>/tables.md,
results.jsonl (what a fresh checkout resumes from) and val_docs.json (the split's per-document bytes)."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from common.stats import BPB_MARGIN, holm, paired, ratio_se
from data.files import atomic_write, read_json
from experiments.horizon import best_setting, collect, means, published, sharing_parts

LN2 = math.log(2.0)
ALPHA = 0.05


def _bpb(r: dict) -> float:
    return math.inf if r["diverged"] or r.get("final_val_bpb") is None else r["final_val_bpb"]


def _doc_bytes(rows: list, docs: Path) -> list | None:
    """The validation split's bytes per document (the same for every run): from a run dir here, else as
    published."""
    for r in rows:
        f = Path(r["trunk"]) / ("trunk" if r["steps"] == max_steps(rows, r) else f"h{r['steps']}") / "final_eval.json"
        if "#" not in r["trunk"] and f.is_file():
            return read_json(f)["docs"]["bytes"]
    f = docs / "val_docs.json"
    return read_json(f)["bytes"] if f.is_file() else None


def max_steps(rows: list, r: dict) -> int:
    return max(x["steps"] for x in rows if x["trunk"] == r["trunk"])


class Cell:
    """A cell at one horizon: its chosen setting (selection seeds), its test runs by seed."""

    def __init__(self, rows: list, cell: str, tpp: float, sel: list, test: list, chosen_at: float | None = None):
        """`chosen_at`: the horizon whose selection chooses the setting (the part's primary horizon: its test
        runs are there), else `tpp` itself."""
        self.name, self.tpp = cell, tpp
        self.setting = best_setting(rows, cell, tpp if chosen_at is None else chosen_at, sel)
        self.grid = means(rows, cell, tpp, sel)
        runs = [r for r in rows if r["cell"] == cell and r["tpp"] == tpp and self.setting
                and (r["lr"], r["mult"]) == self.setting and r["seed"] in test]
        self.test = {r["seed"]: _bpb(r) for r in runs}
        chosen = [_bpb(r) for r in rows if r["cell"] == cell and r["tpp"] == tpp and self.setting
                  and (r["lr"], r["mult"]) == self.setting and r["seed"] in sel]
        self.selection_bpb = statistics.fmean(chosen) if chosen else None
        bpb_rows = [{**r, "val_loss": _bpb(r)} for r in rows if r["cell"] == cell and r["tpp"] == tpp]
        self.grid_bpb = means(bpb_rows, cell, tpp, sel)   # the same choice: bpb is the loss times a constant
        self.runs = {r["seed"]: r for r in runs}

    @property
    def edge(self) -> str:
        """Where the chosen setting sits at the edge of what was tried: 'lr' (of the lrs at its multiplier),
        'mult' (of the multipliers at its lr), both, or ''."""
        if not self.setting:
            return ""
        lr, m = self.setting
        lrs = sorted(k[0] for k in self.grid if k[1] == m)
        mults = sorted(k[1] for k in self.grid if k[0] == lr)
        out = []
        if len(lrs) > 1 and lr in (lrs[0], lrs[-1]):
            out.append("lr")
        if len(mults) > 1 and m in (mults[0], mults[-1]) and not (m == 1.0 and mults[0] == 1.0):
            out.append("mult")
        return "+".join(out)


def compare(a: Cell, b: Cell, doc_bytes: list | None) -> dict:
    """a - b in bpb, paired by seed: the t interval over seeds, % of b's mean, and the validation set's own
    standard error of the mean gap (per-document nats averaged over the shared seeds, clustered by document)."""
    fa = {s: v for s, v in a.test.items() if math.isfinite(v)}
    c = paired(fa, b.test, margins=(BPB_MARGIN,))
    ref = statistics.fmean(b.test.values()) if b.test else math.nan
    seeds = sorted(set(fa) & set(b.test))
    se_val = None
    have = [s for s in seeds if "doc_nats" in a.runs[s] and "doc_nats" in b.runs[s]]
    if doc_bytes and len(have) == len(seeds) and seeds:
        na = [statistics.fmean(a.runs[s]["doc_nats"][d] for s in seeds) for d in range(len(doc_bytes))]
        nb = [statistics.fmean(b.runs[s]["doc_nats"][d] for s in seeds) for d in range(len(doc_bytes))]
        keep = [d for d, nbytes in enumerate(doc_bytes) if nbytes > 0]
        se = ratio_se([na[d] for d in keep], [doc_bytes[d] for d in keep], num_b=[nb[d] for d in keep])
        se_val = None if se is None else se / LN2
    return {"a": a, "b": b, "paired": c, "pct": 100 * c.mean / ref if ref else math.nan, "se_val": se_val,
            "seed_sd": statistics.stdev(c.diffs) if c.n > 1 else None}


def family(comps: list, declared: int | None = None) -> None:
    """Holm over the family, for the difference test and for the TOST at the margin; the verdict words.

    A family with fewer comparisons in than `declared` is held to Holm over all of them: each comparison's Holm p
    lies between its value with every missing p at 0 and with every missing p at 1 (a Holm p never falls when
    another p rises; complete, the two are equal). Where those bounds settle it (ahead whatever the rest give, or
    neither ahead nor equivalent whatever they give) the verdict says so, with the bounds; otherwise it is pending."""
    missing = max(0, (declared or 0) - len(comps))

    def bounds(ps):   # (Holm p with every missing p at 0, with every missing p at 1), per comparison in
        return list(zip(holm(ps + [0.0] * missing), holm(ps + [1.0] * missing)))

    diff = bounds([c["paired"].p for c in comps])
    equiv = bounds([c["paired"].p_equiv.get(BPB_MARGIN) for c in comps])
    for c, (lo, hi), (elo, ehi) in zip(comps, diff, equiv):
        c["holm"], c["holm_equiv"] = (None, None) if missing else (hi, ehi)   # a part of a family has no Holm p
        if lo is None:
            c["verdict"] = "not tested (fewer than 2 paired seeds)"
            continue
        span = f"Holm p {lo:.2g} to {hi:.2g} whatever the other {missing} give"
        if hi < ALPHA:
            c["verdict"] = f"{c['a'].name if c['paired'].mean < 0 else c['b'].name} ahead"
        elif lo >= ALPHA and ehi is not None and ehi < ALPHA:
            c["verdict"] = f"equivalent within ±{BPB_MARGIN:g}"
            span = f"TOST Holm p at most {ehi:.2g}; {span}"
        elif lo >= ALPHA and (elo is None or elo >= ALPHA):
            c["verdict"] = "undecided"
        else:   # only while comparisons are missing: they can still move it across 0.05
            c["verdict"] = f"pending: {len(comps)} of {declared} comparisons in"
        if missing:
            c["verdict"] += f" ({span})"


def _f(x, spec="+.4f") -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def comparison_table(comps: list, title: str) -> list:
    if not comps:  # a part under way: a sentence, not a table with no rows
        return [f"**{title}**: none yet (no comparison has its test seeds on both sides).", ""]
    lines = [f"**{title}** (bits per byte, a − b; negative: a ahead)", "",
             "| a − b | n | mean [95% CI] | % of b | seed SD | val-set s.e. | p | Holm p | "
             f"TOST ±{BPB_MARGIN:g} Holm p | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in comps:
        p = c["paired"]
        lines.append(f"| {c['a'].name} − {c['b'].name} | {p.n} | {_f(p.mean)} {p.ci(4)} | {_f(c['pct'], '+.2f')} | "
                     f"{_f(c['seed_sd'], '.4f')} | {_f(c['se_val'], '.4f')} | {_f(p.p, '.2g')} | "
                     f"{_f(c.get('holm'), '.2g')} | {_f(c.get('holm_equiv'), '.2g')} | {c.get('verdict', '')} |")
    return lines + [""]


def cell_table(cells: dict, tpp: float) -> list:
    lines = [f"Each cell at {tpp:g} tokens per parameter: its setting chosen on the selection seeds (mean bpb there), "
             "and its test seeds in bits per byte of the whole validation split (spikes of the loss, largest grad "
             "norm).", "",
             "| cell | lr | scalar lr × | at the edge of | selection mean | every setting tried (selection "
             "seeds' mean) | test seeds | mean | spikes | max grad norm |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells.values():
        if not c.setting:
            continue
        lr, m = c.setting
        seeds = ", ".join(f"{s}: {_f(v, '.4f')}" for s, v in sorted(c.test.items()))
        mean = statistics.fmean(c.test.values()) if c.test else None
        spikes = sum(r.get("spikes_loss", 0) for r in c.runs.values())
        gn = max((r.get("max_grad_norm") or 0 for r in c.runs.values()), default=None)
        grid = ", ".join(f"{a:g}" + (f"×{b:g}" if b != 1 else "") + f": {v:.4f}"
                         for (a, b), v in sorted(c.grid_bpb.items()))
        lines.append(f"| {c.name} | {lr:g} | {m:g} | {c.edge or '—'} | {_f(c.selection_bpb, '.4f')} | {grid} | "
                     f"{seeds or '—'} | "
                     f"{_f(mean, '.4f')} | {spikes} | {_f(gn, '.2f')} |")
    return lines + [""]


def wall_s(rows: list) -> tuple[float, int, int]:
    """(seconds, trunks with a record, trunks): the part's wall time, measured as the union of its trunks' running
    intervals (`segments`: one per invocation that trained a trunk), so a part run over several invocations, or
    with jobs in parallel, counts each second once; time between invocations is not counted."""
    trunks = {(r["cell"], r["lr"], r["mult"], r["seed"]): r.get("segments") for r in rows}
    spans = sorted(tuple(s) for segs in trunks.values() if segs for s in segs)
    total, end = 0.0, -math.inf
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total, sum(1 for segs in trunks.values() if segs), len(trunks)


def keep_weights(rows: list, part: dict, d: Path, test: list) -> int:
    """The final weights of every test run at the part's primary horizon, in fp16 with the model's config,
    under docs/<study>/weights/<part>/ (committed with the results: a better evaluation needs no retraining).
    `load_kept` reads one back. Returns how many were written now."""
    import torch

    from runtime.checkpoint import find_latest, load_checkpoint

    primary = float(part.get("primary_horizon", part["horizons"][-1]))
    out, n = d / "weights" / part["name"], 0
    for r in rows:
        if r["tpp"] != primary or r["seed"] not in test or "#" in r["trunk"]:
            continue
        if r.get("part", part["name"]) != part["name"]:
            continue  # kept once, under the part that trained it
        f = out / f"{r['cell']}-lr{r['lr']:g}-m{r['mult']:g}-s{r['seed']}.pt"
        run = Path(r["trunk"]) / ("trunk" if r["steps"] == max_steps(rows, r) else f"h{r['steps']}")
        ck = find_latest(run)
        if f.is_file() or ck is None:
            continue
        state = load_checkpoint(ck)
        out.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(".tmp")
        torch.save({"model_config": state["model_config"], "step": state.get("step"),
                    "model": {k: v.half() if v.is_floating_point() else v for k, v in state["model"].items()},
                    **{k: r[k] for k in ("cell", "lr", "mult", "seed", "tpp", "commit")}}, tmp)
        tmp.replace(f)
        n += 1
    return n


def load_kept(path):
    """A kept test run's model (fp32, eval mode) from its fp16 weights."""
    import torch

    from model import GPT, GPTConfig

    d = torch.load(path, map_location="cpu", weights_only=True)
    model = GPT(GPTConfig.from_dict(d["model_config"]))
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in d["model"].items()})
    return model.eval()


def report(study, root: Path, docs: Path, experiment: str) -> None:
    d = docs / study.name
    d.mkdir(parents=True, exist_ok=True)
    pub = published(docs, study)
    lines = [f"# {study.name} study: tables", "",
             "Written by `python scripts/study.py horizon16 --report` from the run dirs and the rows already "
             "published beside it. Every value is in bits per byte of the whole validation split (1,122,177 bytes, "
             "62 files of pysrc with near-duplicates left out), unless a column says nats.", ""]
    all_rows = []
    for part in [p for p in study.parts if p["kind"] == "horizon"]:
        # a part sharing another's sweep reads that part's trunks too: its own cells only
        rows = [r for r in collect(root, part, pub, sharing_parts(study, part)) if r["cell"] in part["cells"]]
        all_rows += rows
        if not rows:
            lines += [f"## Part {part['name']}", "", "No run has finished yet.", ""]
            continue
        doc_bytes = _doc_bytes(rows, d)
        sel, test = list(study.seeds), list(part["test_seeds"])
        keep_weights(rows, part, d, test)
        primary = float(part.get("primary_horizon", part["horizons"][-1]))
        own = [r for r in rows if r["part"] == part["name"]]   # a shared trunk's cost is its own part's
        train_s = sum(r["train_s"] or 0 for r in own if r["steps"] == max_steps(own, r))
        n_trunks, shared = len({r["trunk"] for r in own}), {r["part"] for r in rows} - {part["name"]}
        wall, timed, trunks = wall_s(own)
        commits = ", ".join(sorted({str(r["commit"]) for r in rows}))
        lines += [f"## Part {part['name']}", "",
                  f"{n_trunks} runs finished (trunks with their branches), {train_s / 3600:.1f} h of training time "
                  f"summed over runs (two ran at a time)"
                  + (f"; {wall / 3600:.1f} h of wall time, the union of the running intervals of the "
                     f"{timed} of {trunks} trunks that record them" if timed else "")
                  + (f"; more trunks are read from part {', '.join(sorted(shared))}" if shared else "")
                  + f". Code commits the runs record (each run's is in results.jsonl): {commits}.", ""]
        for t in sorted(float(h) for h in part["horizons"]):
            cells = {c: Cell(rows, c, t, sel, test, chosen_at=primary) for c in part["cells"]}
            role = "primary horizon" if t == primary else f"secondary reading, at the settings chosen at {primary:g}"
            length = ", ".join(f"{n:,} steps, {k:,} tokens" for n, k in sorted(
                {(r["steps"], r["tokens"]) for r in rows if float(r["tpp"]) == t}))
            lines += [f"### {t:g} tokens per parameter ({role})", "", f"Each run: {length}.", ""]
            lines += cell_table(cells, t)
            ref = lambda c: cells.get(study.reference_of(c))  # noqa: E731
            fam = [compare(cells[c], ref(c), doc_bytes) for c in part.get("primary", [])
                   if cells[c].test and ref(c) and ref(c).test]
            abl = []
            for item in part.get("ablation", []):
                a, b = (item, study.reference_of(item)) if isinstance(item, str) else item
                if cells[a].test and cells[b].test:
                    abl.append(compare(cells[a], cells[b], doc_bytes))
            if t == primary:
                family(fam, len(part.get("primary", [])))
                family(abl, len(part.get("ablation", [])))
                # each family the part declares (hca: an ablation family only), a sentence while none is in
                if part.get("primary"):
                    lines += comparison_table(fam, "Primary family (Holm over these)")
                if part.get("ablation"):
                    lines += comparison_table(abl, "Ablation family (Holm over these)")
            else:
                lines += comparison_table(fam + abl, "Secondary: the same comparisons, unadjusted (no verdicts)")
    atomic_write(d / "tables.md", "\n".join(lines) + "\n")
    # one row per trunk and horizon, under the part that trained it (a shared trunk is read by two parts)
    once = {(r["part"], r["cell"], r["lr"], r["mult"], r["seed"], r["tpp"]): r for r in all_rows}
    keep = sorted(once.values(), key=lambda r: (r["part"], r["cell"], r["lr"], r["mult"], r["seed"], r["tpp"]))
    atomic_write(d / "results.jsonl", "".join(json.dumps({k: v for k, v in r.items() if k != "trunk"}) + "\n"
                                              for r in keep))
    doc_bytes = _doc_bytes(all_rows, d) if all_rows else None
    if doc_bytes:
        atomic_write(d / "val_docs.json", json.dumps({"bytes": doc_bytes}) + "\n")
    print(f"wrote {d / 'tables.md'}, {d / 'results.jsonl'} ({len(keep)} rows)")
