"""The repository installs as one package and stands on its own: pyproject.toml and
requirements.txt agree, CI runs the README's test command, and no file edits sys.path or points
outside the repository."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path


try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".ini", ".cfg", ""}


def repo_files() -> list[Path]:
    """The repository's text files: git's view (tracked and not ignored) in a checkout, else a walk."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.splitlines()
        paths = [REPO / f for f in out]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "__pycache__", ".pytest_cache", "runs", "outputs", "multirun", "wandb", "data_cache"}
        paths = [p for p in REPO.rglob("*") if not skip & set(p.relative_to(REPO).parts)]
    return [p for p in paths if p.is_file() and p.suffix in TEXT_SUFFIXES and "egg-info" not in str(p)]


def requirement_names(lines: list[str]) -> list[str]:
    return [re.sub(r"\s+", "", ln.split("#")[0]).lower() for ln in lines if ln.split("#")[0].strip()]


def test_requirements_txt_lists_what_pyproject_installs():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    req = requirement_names((REPO / "requirements.txt").read_text().splitlines())
    assert req == requirement_names(project["dependencies"])
    assert any(r.startswith("torch>=") for r in req)
    assert "pytest" in requirement_names(project["optional-dependencies"]["dev"])


def test_ci_runs_the_readme_test_command_verbatim():
    readme = (REPO / "README.md").read_text()
    section = readme.split("Tests (what CI runs", 1)[1]
    command = re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()
    assert "pip install -e" in command and "pytest" in command
    ci_lines = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    assert command in ci_lines


def test_no_file_edits_sys_path_or_points_outside_the_repository():
    forbidden = {
        "a sys.path edit": re.compile(r"sys\.path\.(insert|append|extend)|PYTHON" + "PATH"),
        # spelt in pieces so that this file does not match itself
        "a path outside the repository": re.compile(r"\.\./" + "sha" + "red|" + "CONTRA" + "CTS"),
    }
    hits = [f"{p.relative_to(REPO)}:{i}: {what}"
            for p in repo_files()
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            for what, rx in forbidden.items() if rx.search(line)]
    assert not hits, "\n".join(hits)


def test_scripts_holds_only_command_lines_that_import_packages_not_each_other():
    """scripts/ is the command lines (the code they run lives in packages): at most 10 entry points, a shell
    wrapper and the program it runs (gpu_check) counted once, and none imports another script by bare name
    (each loads with only the repository's packages importable)."""
    import ast
    import importlib.util

    entries = {p.stem for p in (REPO / "scripts").iterdir() if p.suffix in (".py", ".sh")}
    assert len(entries) <= 10, sorted(entries)
    studies = {p.parent.name for p in (REPO / "studies").glob("*/report.py")}
    for p in sorted((REPO / "scripts").glob("*.py")) + sorted((REPO / "studies").rglob("*.py")):
        tree = ast.parse(p.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not names & (entries | studies | {"report", "horizon", "branches", "runlib"}), (p, names)
    for p in sorted((REPO / "scripts").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"_script_{p.stem}", p)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
