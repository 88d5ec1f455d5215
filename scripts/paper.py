"""Reproduce a paper table with one command: its cost first, then every row's sweep, then the table in the
paper's layout (paper and ours side by side, each beside its difference from Pre-LN).

    python scripts/paper.py --list
    python scripts/paper.py geonorm main --dry-run                   # cost and commands; runs nothing
    python scripts/paper.py geonorm main --files pile_arxiv='/d/arxiv/*.jsonl' --files pile_books3='/d/books3/*.jsonl'
    python scripts/paper.py geonorm main --stand-in pile_books3=pg19 --files pile_arxiv='/d/arxiv/*.jsonl'
    python scripts/paper.py geonorm main --table --out docs/geonorm_main.md
    python scripts/paper.py spheret zero_shot --eval                 # eval.py on every run's final checkpoint
    python scripts/paper.py spheret zero_shot --table

Tables are data (scripts/paper_results.yaml, `tables:`): each row one experiment (configs/experiment/), its
points the columns. A launch runs `sweep.py --experiment <row>` per row with the options given here
(`--jobs`, `--gpus`, `--nproc`, `--slurm`, ... after `--sweep`), in turn; the table reads
<runs-root>/<row>/ (<row>-<stand-in> for a stand-in). The cost (paper_cost.py: the model's own FLOP count,
GPU-hours at --mfu of --gpu's dense peak, tokens, disk, memory per GPU) is printed before anything starts.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from experiments import paper_tables

from common import ConfigError, UserError, report_user_errors

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "paper_results.yaml"


def load_tables(path: Path = RESULTS) -> dict:
    with open(path) as f:
        data = yaml.safe_load(f)
    return data


def pick(data: dict, paper: str | None, table: str | None) -> dict:
    tables = data["tables"]
    if paper not in tables:
        raise ConfigError(f"unknown paper {paper!r}; valid: {', '.join(tables)} (--list shows the tables)")
    if table not in tables[paper]:
        raise ConfigError(f"unknown table {table!r} of {paper}; valid: {', '.join(tables[paper])}")
    return tables[paper][table]


def pairs(items: list[str], flag: str) -> dict:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k or not v:
            raise ConfigError(f"bad {flag} {it!r}: write DATA=VALUE (DATA a data config name, e.g. pile_books3)")
        out[k] = v
    return out


def check_files(files: dict, read: set, globs: bool = True) -> None:
    """Every --files name is a data config some row of the table reads, and (`globs`: a launch here, not a
    --dry-run that may plan for another machine) its glob matches a file: checked once, before the cost and
    before any sweep starts (each row's points would otherwise fail on it)."""
    from data.sources import resolve_files

    for name, pattern in files.items():
        if name not in read:
            raise ConfigError(f"bad --files {name}={pattern}: no row of this table reads data config {name!r} (its "
                              f"rows read: {', '.join(sorted(read))})")
        try:
            if globs:
                resolve_files("files", [pattern])
        except UserError as e:
            raise ConfigError(f"bad --files {name}={pattern}: {' '.join(str(e).split())}") from None


def sweep_commands(spec: dict, args, plans: dict, files: dict, stand: dict) -> list[list[str]]:
    """One sweep.py command per row, with data.files (--files) or a stand-in data config (--stand-in); the
    sweep is named as paper_tables.sweep_dir finds it."""
    cmds = []
    for row in spec["rows"]:
        data = plans[row]["data"]
        sweep, used = paper_tables.sweep_dir(Path(args.runs_root), row, data, stand)
        over, name = [], sweep.name
        if used:
            over.append(f"data={used}")
        elif data in files:
            over.append(f"data.files={files[data]}")
        cmds.append([sys.executable, "scripts/sweep.py", "--experiment", row, "--name", name,
                     "--runs-root", args.runs_root, *shlex.split(args.sweep or ""), "--", *over, *args.overrides])
        if cmds[-1][-1] == "--":
            cmds[-1].pop()
    return cmds


def run_eval(spec: dict, args) -> int:
    """eval.py on the newest checkpoint of every run of the table's rows (--tasks: the table's)."""
    tasks = ",".join(spec["tasks"])
    failed, found = 0, 0
    for row in spec["rows"]:
        for run in sorted((Path(args.runs_root) / row).glob("*/checkpoints")):
            cmd = [sys.executable, "eval.py", str(run.parent), "--tasks", tasks, *shlex.split(args.eval_args or "")]
            print("$ " + shlex.join(cmd), flush=True)
            found += 1
            if not args.dry_run:
                failed += subprocess.call(cmd, cwd=REPO) != 0
    if not found:
        raise ConfigError(f"--eval: no run with a checkpoint under {args.runs_root}/<row>/ for "
                          f"{', '.join(spec['rows'])}: train the table's rows first (paper.py without --eval)")
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paper", nargs="?")
    ap.add_argument("table", nargs="?")
    ap.add_argument("--list", action="store_true", help="the papers' tables and their rows")
    ap.add_argument("--dry-run", action="store_true", help="print the cost and the commands, run nothing")
    ap.add_argument("--table-only", "--table", dest="table_only", action="store_true",
                    help="write the table from the runs (no training)")
    ap.add_argument("--eval", action="store_true", help="zero-shot tables: eval.py on every run's final checkpoint")
    ap.add_argument("--eval-args", help="extra eval.py options, one string (e.g. '--limit 500')")
    ap.add_argument("--files", action="append", default=[], metavar="DATA=GLOB",
                    help="data.files for the rows on data config DATA (repeatable)")
    ap.add_argument("--stand-in", action="append", default=[], metavar="DATA=OTHER",
                    help="train the rows on DATA with data config OTHER instead (e.g. pile_books3=pg19)")
    ap.add_argument("--sweep", help="options passed to every sweep.py, one string (e.g. '--jobs 8 --gpus 0-7')")
    ap.add_argument("--runs-root", default="runs")
    ap.add_argument("--gpu", default=None, help="GPU for the cost (H100, A100, H200 or torch's name; default: "
                                                "the visible one, else H100)")
    ap.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation assumed for the cost")
    ap.add_argument("--out", help="write the table here (.md)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run (after --)")
    args = ap.parse_args(argv)
    data = load_tables()
    if args.list:
        for paper, tables in data["tables"].items():
            for name, spec in tables.items():
                print(f"{paper} {name}: {spec['title']} ({len(spec['rows'])} row(s): {', '.join(spec['rows'])})")
        return 0
    spec = pick(data, args.paper, args.table)
    if not 0 < args.mfu <= 1:
        raise ConfigError(f"--mfu={args.mfu}: must be in (0, 1]")
    stand = pairs(args.stand_in, "--stand-in")
    if args.table_only:
        text = paper_tables.write(spec, data["settings"], Path(args.runs_root), stand, data.get("stand_ins", {}))
        if args.out:
            from data.files import atomic_write, writable_dir

            writable_dir(Path(args.out).resolve().parent, "--out")
            atomic_write(Path(args.out), text)
        print(text, end="")
        return 0
    if args.eval:
        return run_eval(spec, args)
    from experiments.cost import gpu_name, plan_row, render_cost

    gpu = gpu_name(args.gpu)
    files = pairs(args.files, "--files")
    plans = {row: plan_row(row, args.overrides, stand, files) for row in spec["rows"]}
    check_files(files, {plans[row]["data"] for row in spec["rows"]}, globs=not args.dry_run)
    print(render_cost(spec, plans, gpu, args.mfu), flush=True)
    cmds = sweep_commands(spec, args, plans, files, stand)
    for cmd in cmds:
        print("$ " + shlex.join(["python", *cmd[1:]]), flush=True)
    if args.dry_run:
        return 0
    for cmd in cmds:
        rc = subprocess.call(cmd, cwd=REPO)
        if rc != 0:
            print(f"paper.py: the sweep of {cmd[cmd.index('--experiment') + 1]} ended with exit status {rc}; "
                  "rerun the same command to resume it", file=sys.stderr)
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(report_user_errors(main))
