"""Studies as data: a study is studies/<name>/study.yaml (with its report.py beside it where it has one),
read and checked once (`Study`), and run part by part (`Runner`); scripts/study.py is the command line.
A study file names a base experiment, the overrides of every run, the seeds, the tuned key with its
ladder of values (`tune`), named cells (overrides and the start of their grid), its parts and its report.
Part kinds, each a resumable sweep (scripts/sweep.py) under <runs-root>/<sweep>/:
  grid    each cell at the ladder points around its start (`tune.width` on each side), every seed;
  edge    (`of`: a part) where a cell's best value is the largest or smallest tried, one more ladder point
          beyond it, every seed; repeated until the best is inside, at most `tune.edge_rounds` points beyond
          the cell's grid on a side (counted from its runs, so resuming never adds more);
  rerun   (`of`) the cells of `pick` at their best value in `of`, with `seeds` and `overrides` of its own
          (a chaos control: train.threads=2; more seeds at the best);
  shapes  (`of`) the cells of `pick` at other model shapes (`shapes`: factors of the base model), shape
          by shape, each a grid around the cell's best in `of`, bracketed as edge does;
  vary    (`of`) the cells of `pick` at their best setting in `of`, at each of `values` of a second key
          (`key`); its best setting adds that key's best, the runs of `of` at its default included;
  points  the points of another experiment (`experiment`, its experiment_meta.points), as they are;
  horizon (`horizons` in tokens per parameter, `test_seeds`; `cells`, or `pick` of `of`) a trunk and WSD
          cooldown branches per setting and seed, lr chosen on the study's seeds and tested on fresh ones
          (experiments/horizon.py); `starts` ({cell: value}) moves a cell's grid centre for that part;
  script  <script>.py beside the study file, <run dir> <args>, on the runs `runs` selects (`of` a part:
          its `cells`, or its bests with `best: true`; `seeds`), skipping a run dir that has the script's
          `output` already.
`pick` lists cells, and `best_of: [cells]` for the best of those (lowest mean at its best value). A rerun's
`ablations` (`<name>: {of: <cell>, overrides: {...}}`) add cells that change one choice of a picked cell,
run at that cell's best setting. `seeds` of a part replaces the study's for that part.
The best value of a cell is the one with the lowest mean final validation loss over the seeds every value
was run with (experiments/runs.py: best_over). Wall time and code commit per part are added up in
<runs-root>/<study>_times.json and <study>_commits.json; each tuned part's bests are recorded in
docs/<study>/<sweep suffix>_best.json, so later parts can start on a checkout without the run dirs.
The report is the study's own report.py beside its study.yaml (report(study, runs_root, docs, experiment)),
else a table per part (experiments/study_tables.py), and for each of the study's `contrasts` ({a, b, at}) cell a
against cell b at one value of the tuned key (not only at each one's best), with the same statistics.
"""
from __future__ import annotations

import functools
import json
import re
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Optional

import yaml

from experiments import runs as runlib
from experiments.study_parts import build_part
from common import UserError, children
from common.config import Name, NonNegInt, PosInt, Positive, build, check
from common.errors import ConfigError
from common.provenance import code_commit
from data.files import atomic_write, read_json, read_yaml

REPO = Path(__file__).resolve().parent.parent
STUDIES = REPO / "studies"


@dataclass
class Tune:
    """A study file's `tune`: the key its cells are tuned on and the values tried."""
    key: Name = "optim.lr"
    ladder: list = field(default_factory=list)   # the values, in order; a cell's grid is around its start
    factor: Optional[Positive] = None              # instead of a ladder: a cell's values are start x factor^k
    width: PosInt = 1                              # ladder points on each side of the start
    edge_rounds: NonNegInt = 2                     # points beyond a cell's grid on a side, at most this many

    def __post_init__(self) -> None:
        check(self, "tune", ConfigError)


@dataclass
class Study:
    """A study file, read and checked once through the config layer (a bad entry: one line naming the file
    and the key); the part kinds' own keys are checked here."""
    name: str
    path: Path
    experiment: Name
    cells: dict                     # cell -> {"overrides": {...}, "start": value}
    parts: list                     # the parts in order, each its kind's typed Part (experiments/study_parts.py)
    tune: Tune = field(default_factory=Tune)
    seeds: list = field(default_factory=lambda: [0])
    overrides: list = field(default_factory=list)   # key=value strings every run gets
    reference: Optional[str] = None
    doc: Optional[str] = None
    contrasts: list = field(default_factory=list)   # {a, b, at}: cell a against b at one value of the key
    made: dict = field(default_factory=dict, repr=False)   # label -> the cell whose point it is (at())

    def __post_init__(self) -> None:
        check(self, "study", ConfigError)

    key = property(lambda self: self.tune.key)
    ladder = property(lambda self: self.tune.ladder)
    factor = property(lambda self: self.tune.factor)
    width = property(lambda self: self.tune.width)
    edge_rounds = property(lambda self: self.tune.edge_rounds)

    @classmethod
    def load(cls, name: str, studies: Path = STUDIES) -> "Study":
        path = Path(name) if name.endswith(".yaml") else studies / name / "study.yaml"
        if not path.is_file():
            valid = ", ".join(sorted(p.parent.name for p in studies.glob("*/study.yaml")))
            raise SystemExit(f"unknown study {name!r}: no {path} (studies: {valid})")
        d = read_yaml(path, "a study: a mapping with experiment, cells and parts (studies/*/study.yaml)")

        def bad(key, why):
            raise SystemExit(f"{path}: {key}: {why}")
        file_keys = [f.name for f in fields(cls) if f.name not in ("name", "path", "made")]
        if d.get("tune") is None:
            d.pop("tune", None)
        try:
            study = build(cls, d, "study", ConfigError, keys=file_keys,
                          name=path.parent.name if path.name == "study.yaml" else path.stem, path=path)
            study.parts = [build_part(i, p) for i, p in enumerate(study.parts)]  # each kind's own keys
        except UserError as e:
            raise SystemExit(f"{path}: {e}") from None
        tunes = any(p.get("kind") not in ("points", "script") for p in study.parts)
        if bool(study.ladder) == bool(study.factor) and (tunes or study.ladder or study.factor):
            bad("tune", "give one of ladder (the values) and factor (start x factor^k)")
        for c, spec in study.cells.items():
            if not isinstance(spec, dict) or "overrides" not in spec:
                bad(f"cells.{c}", "needs overrides (and start)")
        names = [p.get("name") for p in study.parts]
        for i, p in enumerate(study.parts):
            needs_of = p["kind"] not in ("grid", "points", "script", "horizon") or (
                p["kind"] == "horizon" and "pick" in p
            )
            if needs_of and p.get("of") not in names[:i]:
                bad(
                    f"parts.{p['name']}.of",
                    f"{p.get('of')!r} is not an earlier part ({', '.join(names[:i]) or 'none'})",
                )
            ablated = [a.get("of") for a in (p.get("ablations") or {}).values()]
            for c in study.picked_names(p.get("pick", [])) + ablated + list(p.get("cells", [])):
                if c not in study.cells:
                    bad(f"parts.{p['name']}.pick", f"unknown cell {c!r}")
        for i, c in enumerate(study.contrasts):
            if not isinstance(c, dict) or set(c) != {"a", "b", "at"} or not {c["a"], c["b"]} <= set(study.cells):
                bad(f"contrasts[{i}]", "needs a and b (cells) and at (a value of their tuned key)")
        if study.reference is not None and not any(c == study.reference or c.endswith("." + study.reference)
                                                   for c in study.cells):
            bad("reference", f"unknown cell {study.reference!r} (a cell, or the <block>.<cell> suffix of some)")
        return study

    # --- names and points ---------------------------------------------------------------------

    def part(self, name: str) -> dict:
        for p in self.parts:
            if p["name"] == name:
                return p
        raise SystemExit(f"unknown part {name!r} of study {self.name}: valid parts are "
                         f"{', '.join(p['name'] for p in self.parts)}")

    def reference_of(self, cell: str) -> str | None:
        """The cell a table tests `cell` against: the reference, within the cell's block where cells are
        named <block>.<name> (llama.hc against llama.pre_ln)."""
        if self.reference is None or self.reference in self.cells:
            return self.reference
        return f"{cell.split('.', 1)[0]}.{self.reference}" if "." in cell else None

    def sweep_of(self, part: dict) -> str:
        """The sweep (run dir group) a part writes to: its own, else its `of` part's (edge adds points)."""
        if part.get("sweep") or part["kind"] == "script":
            return part.get("sweep")             # a script part runs in other parts' run dirs
        return self.sweep_of(self.part(part["of"]))

    @staticmethod
    def picked_names(pick: list) -> list:
        out = []
        for item in pick:
            out += item["best_of"] if isinstance(item, dict) else [item]
        return out

    def around(self, value: float) -> list:
        """The ladder points nearest `value` and `width` on each side (fewer at the ladder's ends); with a
        factor, value x factor^k for k in -width..width."""
        if self.factor:
            return [value * self.factor ** k for k in range(-self.width, self.width + 1)]
        i = min(range(len(self.ladder)), key=lambda k: abs(self.ladder[k] / value - 1))
        return self.ladder[max(i - self.width, 0):i + self.width + 1]

    def beyond(self, value: float, up: bool) -> float | None:
        """The next value above (`up`) or below `value`: the next ladder point, or value x factor^(+-1)."""
        if self.factor:
            return value * self.factor if up else value / self.factor
        i = min(range(len(self.ladder)), key=lambda k: abs(self.ladder[k] / value - 1))
        j = i + 1 if up else i - 1
        return self.ladder[j] if 0 <= j < len(self.ladder) else None

    def key_of(self, cell: str) -> str:
        """The key a cell tunes: its own `key`, else the study's (a shape's cell, `w64-pre_ln`, its cell's)."""
        if cell in self.cells:
            return self.cells[cell].get("key", self.key)
        return self.key_of(cell.split("-", 1)[1]) if "-" in cell else self.key

    def point(self, cell: str, value: float, overrides: dict) -> tuple[str, dict]:
        return self.at(cell, {self.key_of(cell): value}, overrides)

    def at(self, cell: str, setting: dict, overrides: dict) -> tuple[str, dict]:
        """A point at a setting (key -> value): labelled <cell>-<last part of each key>-<value>; the cell
        that made each label is kept (`made`) so the sweep's manifest records it beside the point."""
        label = cell + "".join(f"-{k.rsplit('.', 1)[-1]}-{v:g}" for k, v in setting.items())
        self.made[label] = cell
        return label, {**overrides, **setting}

    @functools.cached_property
    def _label_tail(self) -> re.Pattern:
        """<anything>-<last part of a key the study tunes>-<value>, once per study (cell_of runs per run)."""
        keys = {self.key, *(c.get("key", self.key) for c in self.cells.values()),
                *(p["key"] for p in self.parts if p["kind"] == "vary")}
        return re.compile(r"^(.*)-(" + "|".join(re.escape(k.rsplit(".", 1)[-1]) for k in keys) + r")-[-+.e0-9]+$")

    def cell_of_run(self, run) -> str:
        """The cell of a run: as its sweep's manifest records it, else (a run from before the manifest held
        it) read back from its label."""
        return run.cell or self.cell_of(run.base)

    def cell_of(self, label: str) -> str:
        """The cell of a point's label: its <key>-<value> suffixes (of every key the study tunes) dropped."""
        while (m := self._label_tail.match(label)) and m.group(1):
            label = m.group(1)
        return label

    def by_cell(self, runs: list) -> dict:
        out: dict = {}
        for r in runs:
            out.setdefault(self.cell_of_run(r), []).append(r)
        return out

    def best(self, runs: list) -> dict:
        """cell -> runlib.best_over over the tuned key (the mean over the seeds every value was run with)."""
        return {c: runlib.best_over({c: rs}, self.key_of(c))[c] for c, rs in self.by_cell(runs).items()}

    def edge_points(self, runs: list, cells: dict) -> dict:
        """One more ladder point beyond each cell's best (cells: label -> overrides) where the best is the
        largest or smallest value tried, while fewer than `edge_rounds` of the values it tried lie beyond its
        starting grid on that side: counted from the runs, so a study resumed mid-bracket adds no more than
        an unbroken one."""
        out = {}
        for cell, b in self.best(runs).items():
            if not runlib.at_edge(b) or cell not in cells:
                continue
            best, tried = float(b["value"]), [float(v) for v in b["by_value"]]
            up = best == max(tried)
            start = self.around(self.cells[cell]["start"]) if cell in self.cells else tried
            beyond = [v for v in tried if (v > max(start) if up else v < min(start))]
            nxt = self.beyond(best, up=up)
            if nxt is not None and len(beyond) < self.edge_rounds:
                lbl, ovr = self.point(cell, nxt, cells[cell])
                out[lbl] = ovr
        return out

    def pick(self, pick: list, best: dict) -> list:
        """The cells of a `pick` list that have a best (`best`: cell -> (best setting, mean there); a
        `best_of` group: its member with the lowest mean)."""
        out = []
        for item in pick:
            if isinstance(item, dict):
                members = [c for c in item["best_of"] if c in best]
                item = min(members, key=lambda c: best[c][1]) if members else None
            if item is not None and item in best and item not in out:
                out.append(item)
        return out

    def setting_value(self, cell: str, setting: dict) -> float:
        """The tuned key's value in a best setting (a shapes part centres its grid on it)."""
        return float(setting[self.key_of(cell)])

    def shapes(self, model: dict, specs: list) -> dict:
        """label -> model overrides: each spec's factors applied to the base model's values."""
        out = {}
        for spec in specs:
            new = {k: max(1, round(model[k] * f)) for k, f in spec.items() if k != "label"}
            out[spec["label"].format(**{**model, **new})] = {f"model.{k}": v for k, v in new.items()}
        return out

    def base_model(self, experiment: str | None = None) -> dict:
        """The base experiment's composed `model` group (its shape) and its tokenizer's vocabulary size."""
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        from data import get_tokenizer
        from trainer.config_store import register_code_configs

        register_code_configs()
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
            cfg = compose("config", overrides=[f"experiment={experiment or self.experiment}"])
        return {**OmegaConf.to_container(cfg.model, resolve=True),
                "tokenizer_vocab": get_tokenizer(cfg.data.tokenizer).vocab_size}


def mean_at_best(b: dict) -> float:
    return b["by_value"][b["value"]]


# --- running ---------------------------------------------------------------------------------------

class Runner:
    def __init__(self, study: Study, args):
        self.study, self.args = study, args
        self.cells = {c: study.cells[c] for c in args.cells}

    def sweep(self, name: str, points: dict, seeds: list, extra: list = (), jobs: int | None = None,
              experiment: str | None = None) -> None:
        """Run `points` (label -> overrides) as the sweep `name`, in this process: the sweep's own planning,
        manifest and checks (experiments/sweep.py), each point a train.py child."""
        from experiments import sweep as sweeps

        if not points:
            return
        argv = ["--name", name, "--runs-root", str(self.args.runs_root), "--experiment",
                experiment or self.args.experiment, "--jobs", str(jobs or self.args.jobs),
                *(["--gpus", self.args.gpus] if self.args.gpus else []),
                *(["--oversubscribe"] if self.args.oversubscribe else []),
                *(["--seeds", ",".join(map(str, seeds))] if seeds is not None else []),
                "--", *self.study.overrides, *extra, *self.args.overrides]
        print(f"# sweep {name}: {len(points)} point(s), {' '.join(argv)}", flush=True)
        args = sweeps.parser().parse_args(argv)
        args.points = points
        args.cells = {label: self.study.made.get(label, label) for label in points}   # recorded in sweep.json
        if sweeps.run(args) != 0:
            raise SystemExit(f"sweep {name} had failed points; rerun to resume them")

    def finished(self, sweep: str) -> list:
        return [r for r in runlib.load_sweep(self.args.runs_root / sweep) if r.finished]

    def best_file(self, sweep: str) -> Path:
        return self.args.docs / self.study.name / f"{sweep.removeprefix(self.study.name + '_')}_best.json"

    def best_runs(self, part: dict) -> dict:
        """cell -> runlib.best_over result, its `setting` (key -> best value) added, of a part's finished
        runs; a vary part's: the best of its key over its runs and the runs of `of` at their best setting
        with the part's seeds, for every cell of `of` (a cell it did not vary keeps its setting there)."""
        s = self.study
        if part["kind"] != "vary":
            out = s.best(self.finished(s.sweep_of(part)))
            return {c: {**b, "setting": {s.key_of(c): float(b["value"])}} for c, b in out.items()}
        of = self.best_runs(s.part(part["of"]))
        seeds = {str(x) for x in part.get("seeds", s.seeds)}
        out = dict(of)
        for c, rs in s.by_cell(self.finished(s.sweep_of(part))).items():
            if c in of:
                base = [r for r in of[c]["runs"] if str(r.seed) in seeds]
                b = runlib.best_over({c: rs + base}, part["key"])[c]
                out[c] = {**b, "setting": {**of[c]["setting"], part["key"]: float(b["value"])}}
        return out

    def bests(self, part: dict) -> dict:
        """cell -> (best setting, mean there) of a part's finished runs; from its recorded bests
        (docs/<study>/*_best.json) where the run dirs are not on this checkout."""
        found = self.best_runs(part)
        if found:
            return {c: (b["setting"], mean_at_best(b)) for c, b in found.items()}
        recorded = self.best_file(self.study.sweep_of(part))
        if recorded.is_file():
            return {c: (v.get("setting") or {self.study.key_of(c): v.get("value", v.get("lr"))}, v["mean"])
                    for c, v in read_json(recorded).items()}
        return {}

    def record_bests(self, part: dict) -> None:
        best = {c: {"value": float(b["value"]), "setting": b["setting"], "mean": mean_at_best(b),
                    "edge": runlib.at_edge(b)} for c, b in self.best_runs(part).items()}
        if best:
            path = self.best_file(self.study.sweep_of(part))
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(best, indent=1) + "\n")

    def grid(self, sweep: str, cells: dict, seeds: list) -> None:
        """cells: label -> (overrides, centre)."""
        s = self.study
        self.sweep(sweep, dict(s.point(c, v, o) for c, (o, centre) in cells.items() for v in s.around(centre)), seeds)

    def bracket(self, sweep: str, cells: dict, seeds: list) -> None:
        asked = set()
        while True:  # edge_points stops a cell after `edge_rounds` points beyond its grid on a side
            pts = self.study.edge_points(self.finished(sweep), cells)
            if not pts or set(pts) <= asked:  # nothing new (a point that ran but did not finish): stop
                break
            asked |= set(pts)
            self.sweep(sweep, pts, seeds)

    def picked(self, part: dict, best: dict) -> list:
        return [c for c in self.study.pick(part.get("pick", list(self.study.cells)), best) if c in self.cells]

    def run_part(self, part: dict) -> None:
        s, kind = self.study, part["kind"]
        sweep, seeds = s.sweep_of(part), part.get("seeds", s.seeds)
        if kind == "grid":
            self.grid(sweep, {c: (spec["overrides"], spec["start"]) for c, spec in self.cells.items()}, seeds)
        elif kind == "edge":
            self.bracket(sweep, {c: spec["overrides"] for c, spec in self.cells.items()}, seeds)
        elif kind == "rerun":
            best = self.bests(s.part(part["of"]))
            cells = {c: (best[c][0], self.cells[c]["overrides"]) for c in self.picked(part, best)}
            for name, a in (part.get("ablations") or {}).items():
                if a["of"] in cells:
                    cells[name] = (best[a["of"]][0], {**self.cells[a["of"]]["overrides"], **a.get("overrides", {})})
            threads = next(
                (int(o.split("=")[1]) for o in part.get("overrides", []) if o.startswith("train.threads=")), 1
            )
            self.sweep(sweep, dict(s.at(c, setting, o) for c, (setting, o) in cells.items()), seeds,
                       part.get("overrides", []), jobs=max(1, self.args.jobs // threads))
        elif kind == "vary":
            best = self.bests(s.part(part["of"]))
            self.sweep(sweep, dict(s.at(c, {**best[c][0], part["key"]: float(v)}, self.cells[c]["overrides"])
                                   for c in self.picked(part, best) for v in part["values"]), seeds)
        elif kind == "points":
            path = REPO / "configs" / "experiment" / f"{part['experiment']}.yaml"
            points = yaml.safe_load(path.read_text())["experiment_meta"]["points"]
            # without seeds of its own, a points part runs the experiment's (experiment_meta seeds, extra_seeds)
            self.sweep(sweep, points, part.get("seeds"), experiment=part["experiment"])
        elif kind == "script":
            self.script(part)
        elif kind == "horizon":  # trunks and cooldown branches, selection and test seeds (experiments/horizon.py)
            from experiments import horizon
            horizon.run_part(self, part)
        elif kind == "shapes":
            best = self.bests(s.part(part["of"]))
            picked = s.pick(part["pick"], best)
            if len(picked) < len(part["pick"]):
                raise SystemExit(f"part {part['name']} needs part {part['of']} finished for the cells it picks")
            grid = s.shapes(s.base_model(self.args.experiment), part["shapes"])
            for shape in self.args.shapes or list(grid):   # shape by shape: a study stopped part-way has whole shapes
                if shape not in grid:
                    raise SystemExit(f"unknown --shapes {shape}: valid are {', '.join(grid)}")
                cells = {f"{shape}-{c}": ({**s.cells[c]["overrides"], **grid[shape]}, s.setting_value(c, best[c][0]))
                         for c in picked}
                self.grid(sweep, cells, seeds)
                self.bracket(sweep, {c: o for c, (o, _) in cells.items()}, seeds)
        if kind in ("grid", "edge", "vary"):
            self.record_bests(part)

    def script_targets(self, part: dict) -> list:
        """The run dirs a script part works on, in the order of its `runs` selectors."""
        s, out = self.study, []
        for sel in part["runs"]:
            of = s.part(sel["of"])
            if sel.get("best"):
                runs = [r for b in self.best_runs(of).values() for r in b["runs"]]
            else:
                runs = [r for c, rs in s.by_cell(self.finished(s.sweep_of(of))).items() for r in rs
                        if c in sel.get("cells", [c])]
            out += [r for r in runs if "seeds" not in sel or str(r.seed) in {str(x) for x in sel["seeds"]}]
        return out

    def script(self, part: dict) -> None:
        for r in self.script_targets(part):
            if (r.path / part["output"]).is_file():
                print(f"# skip (done): {r.path / part['output']}")
                continue
            cmd = [
                sys.executable,
                str(self.study.path.parent / f"{part['script']}.py"),
                str(r.path),
                *map(str, part.get("args", [])),
            ]
            print("$", " ".join(cmd), flush=True)
            if children.run(cmd) != 0:
                raise SystemExit(f"{part['script']} on {r.path} failed")


def record(root: Path, study: Study, part: str, seconds: float) -> None:
    """Add the part's wall time, and this checkout's commit, to <root>/<study>_{times,commits}.json."""
    runlib.add_wall_time(root / f"{study.name}_times.json", part, seconds)
    path = root / f"{study.name}_commits.json"
    done = read_json(path) if path.is_file() else {}
    c = code_commit(REPO) or "unknown"
    if c not in done.setdefault(part, []):
        done[part].append(c)
    atomic_write(path, json.dumps(done, indent=1) + "\n")


def report(study: Study, root: Path, docs: Path, experiment: str) -> None:
    """The study's tables and figures under <docs>/<study>/ from its finished runs. Without any (a fresh
    checkout has no run dirs) the report writes nothing: the committed tables there are results."""
    sweeps = sorted({s for s in map(study.sweep_of, study.parts) if s})
    if not any(runlib.is_finished(m.parent) for s in sweeps for m in (root / s).rglob("metrics.jsonl")):  # stops at one
        print(f"no finished runs of {study.name} under {root} ({', '.join(sweeps)}): {docs / study.name} left as it is")
        return
    if (study.path.parent / "report.py").is_file() and study.path.parent.parent == STUDIES:
        import importlib
        importlib.import_module(f"studies.{study.name}.report").report(study, root, docs, experiment)
    else:
        from experiments import study_tables
        study_tables.report(study, root, docs)


def check_setting(study: Study, args) -> None:
    """The experiment and the overrides every run shares compose into a valid config (one line otherwise),
    before --list says what would run or anything starts."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from common import UserError
    from trainer.config import parse_run_config
    from trainer.config_store import composition_error, register_code_configs

    if not (REPO / "configs" / "experiment" / f"{args.experiment}.yaml").is_file():
        valid = sorted(p.stem for p in (REPO / "configs" / "experiment").glob("*.yaml"))
        raise SystemExit(f"--experiment {args.experiment}: no configs/experiment/{args.experiment}.yaml; valid: "
                         + ", ".join(valid))
    register_code_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        try:
            overrides = [f"experiment={args.experiment}", *study.overrides, *args.overrides]
            parse_run_config(compose("config", overrides=overrides))
        except UserError as e:
            raise SystemExit(f"{study.name}: {' '.join(str(e).split())}") from None
        except HydraException as e:
            raise SystemExit(f"{study.name}: {composition_error(e, overrides)}") from None


def run_parts(runner, parts: list, args) -> None:
    study = runner.study
    for part in parts:
        t0 = time.time()
        try:
            runner.run_part(part)
        finally:  # wall time per part, added up over resumed invocations (the report prints it)
            record(args.runs_root, study, part["name"], time.time() - t0)
        print(f"### part {part['name']}: {time.time() - t0:.0f} s wall", flush=True)
