"""`python train.py --help`: the config groups and every option with its one-line doc.

The docs are the inline comments of the YAML files in configs/ (the single place they are written),
so the help cannot drift from the defaults it shows. Hydra's own help is `--hydra-help`.
"""
from __future__ import annotations

import re
from pathlib import Path

# `key: value   # doc` (a '#' inside a quoted value is not a comment; our configs have none)
_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w]*):\s*(?P<value>[^#]*?)\s*(?:#\s*(?P<doc>.*))?$")


def _options(path: Path, prefix: str) -> list[tuple[str, str, str]]:
    """(dotted key, default, doc) for each key of a config file, nested keys included."""
    out, parents = [], []  # parents: (indent, key) of the enclosing mappings
    for line in path.read_text().splitlines():
        m = _LINE.match(line)
        if not m or line.lstrip().startswith(("#", "-")):
            continue
        indent = len(m["indent"])
        while parents and parents[-1][0] >= indent:
            parents.pop()
        key = ".".join([prefix, *(k for _, k in parents), m["key"]])
        if m["value"] == "" and not m["doc"]:  # a mapping: its keys follow, indented
            parents.append((indent, m["key"]))
            continue
        out.append((key, m["value"], m["doc"] or ""))
    return out


def _first_comment(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("#") and not line.startswith("# @package"):
            return line.lstrip("# ").strip()
    return ""


def config_help(config_dir: Path) -> str:
    config_dir = Path(config_dir)
    top = (config_dir / "config.yaml").read_text()
    defaults = dict(re.findall(r"^\s*-\s*(\w+):\s*(\w+)", top, flags=re.M))
    lines = ["usage: python train.py [group=option ...] [key=value ...]",
             "       torchrun --nproc_per_node=N train.py ...    (DDP; see README)",
             "",
             "Hydra overrides: `group=option` picks a file of a config group, `key=value` sets one option.",
             "Every option is typed and checked at start-up. Hydra's own help: --hydra-help.",
             "",
             "Config groups (default in brackets):"]
    for group in sorted(defaults):
        choices = sorted(p.stem for p in (config_dir / group).glob("*.yaml"))
        if not choices:
            continue
        default = defaults[group]
        shown = ", ".join(f"[{c}]" if c == default else c for c in choices)
        lines.append(f"  {group + '=':<12} {shown}")
    lines += ["", "Options (key=default  doc), from the default file of each group:"]
    for group in ("train", "optim", "logging", "model", "norm", "data"):
        path = config_dir / group / f"{defaults[group]}.yaml"
        lines += ["", f"{group}.*  ({path.relative_to(config_dir.parent)}: {_first_comment(path)})"]
        for key, value, doc in _options(path, group):
            left = f"  {key}={value}"
            lines.append(f"{left:<40} {doc}".rstrip())
    lines += ["", "Top level (where the run goes):"]
    for key in ("run_name", "out_dir"):
        m = re.search(rf"^{key}:\s*(.*)$", top, flags=re.M)
        lines.append(f"  {key}={m[1] if m else ''}")
    return "\n".join(lines)
