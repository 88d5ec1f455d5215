"""The repository installs as one package and stands on its own: pyproject.toml and
requirements.txt agree, CI runs the README's test command, and no file edits sys.path or points
outside the repository."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fidelity_report", "step_scale_report"])
def test_library_modules_of_scripts_say_they_are_not_commands(name):
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, f"scripts/{name}.py", "--help"], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "it is not a command" in out.stderr and f"scripts/{name}.py" in out.stderr


def test_every_script_imports(load_script):
    """Each scripts/*.py imports cleanly as scripts/ sees it: a helper renamed in one script must not
    break another only when that one runs (plot_geometry imported a colour table plot_curves had dropped)."""
    libraries = ["plot_curves", "study_tables"]  # imported by the others by bare name: loaded first
    for name in libraries + sorted({p.stem for p in (REPO / "scripts").glob("*.py")} - set(libraries)):
        assert load_script(name).__file__ == str(REPO / "scripts" / f"{name}.py")
