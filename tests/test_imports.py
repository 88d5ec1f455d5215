"""Every module of the packages imports on its own, and no module imports one that imports it back."""
from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "model", "data", "runtime", "trainer", "evaluation", "experiments")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def import_time_edges(name: str, path: Path, type_hints: bool = False) -> set[str]:
    """The project modules `name` imports anywhere: at module level, in class bodies and in function
    bodies (a deferred import is still a dependency); `if TYPE_CHECKING:` blocks never run, so they
    count only with `type_hints` (a reader follows them too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: set[str] = set()

    def target(mod: str | None, level: int) -> str:
        if not level:
            return mod or ""
        base = package.split(".")
        base = base[:len(base) - (level - 1)]
        return ".".join(base + ([mod] if mod else []))

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not type_hints:
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                mod = target(node.module, node.level)
                edges.add(mod)
                edges.update(f"{mod}.{a.name}" for a in node.names)  # `from pkg import submodule`
            visit(ast.iter_child_nodes(node))

    visit(ast.parse(path.read_text()).body)
    return {e for e in edges if e in MODULES and e != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def dfs(u: str) -> list[str] | None:
        state[u] = 1
        path.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                return path[path.index(v):] + [v]
            if v not in state and (c := dfs(v)):
                return c
        path.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state and (c := dfs(u)):
            return c
    return None


def test_the_modules_are_found():
    assert {"model", "model.gpt", "data.prepare", "trainer.loop", "evaluation.harness"} <= set(MODULES)


@pytest.mark.parametrize("type_hints", [False, True])
def test_no_import_cycle(type_hints):
    """None at run time, and none through the type hints' imports either."""
    graph = {name: import_time_edges(name, path, type_hints) for name, path in MODULES.items()}
    assert "model.norm_options" in graph["model.config"]  # the parser sees relative imports
    assert "trainer.schedules" in graph["trainer.optim"]
    assert ("model.config" in graph["model.norms"]) == type_hints  # a type hint's import, counted only then
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_layers_point_one_way():
    """Evaluation and sampling share the runtime with training, not training itself; the runtime and
    the model know nothing of training or evaluation."""
    graph = {name: import_time_edges(name, path) for name, path in MODULES.items()}
    entry = {"eval": REPO / "eval.py", "sample": REPO / "sample.py"}
    graph.update({name: import_time_edges(name, path) for name, path in entry.items()})
    for user, banned in (("evaluation", "trainer"), ("eval", "trainer"), ("sample", "trainer"),
                         ("runtime", "trainer"), ("runtime", "evaluation"), ("model", "trainer"),
                         ("model", "evaluation"), ("model", "runtime"), ("data", "model")):
        bad = {(m, d) for m, deps in graph.items() if m.split(".")[0] == user
               for d in deps if d.split(".")[0] == banned}
        assert not bad, f"{user} imports {banned}: {sorted(bad)}"
    assert "runtime.checkpoint" in graph["eval"] and "runtime.distributed" in graph["evaluation.harness"]


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.slow
def test_every_module_imports_on_its_own(tmp_path):
    """Each module in a process of its own, from outside the checkout (so the installed package is
    what is found). Third-party libraries are loaded once and each module is imported in a forked
    child, so no project module is loaded before the one under test."""
    script = textwrap.dedent("""
        import importlib, os, sys, traceback
        import numpy, torch, yaml, omegaconf, hydra  # third-party only: shared by the children
        failed = []
        for name in sys.argv[1:]:
            pid = os.fork()
            if pid == 0:
                try:
                    importlib.import_module(name)
                    code = 0
                except BaseException:
                    traceback.print_exc()
                    code = 1
                sys.stdout.flush(); sys.stderr.flush()
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            if status:
                failed.append(name)
        print("FAILED", *failed)
        sys.exit(1 if failed else 0)
    """)
    if not hasattr(__import__("os"), "fork"):  # no fork: one interpreter per module
        bad = [m for m in MODULES if subprocess.run([sys.executable, "-c", f"import {m}"],
                                                    cwd=tmp_path, capture_output=True).returncode]
        assert not bad
        return
    proc = subprocess.run([sys.executable, "-c", script, *MODULES], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.strip() == "FAILED"
