"""constraints.txt pins every direct dependency of pyproject.toml at a version its specifier allows, so the
documented `pip install ... -c constraints.txt` reproduces the set the suite passed with."""
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent


def test_constraints_pin_every_dependency_within_its_specifier():
    py = tomllib.loads((REPO / "pyproject.toml").read_text())
    reqs = [Requirement(d) for d in py["project"]["dependencies"] + py["project"]["optional-dependencies"]["dev"]]
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    for r in reqs:
        key = r.name.lower().replace("_", "-")
        assert key in pins, f"{r.name} has no pin in constraints.txt"
        assert r.specifier.contains(pins[key], prereleases=True), f"{r.name}=={pins[key]} outside {r.specifier}"
