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


def test_constraints_pin_every_installed_distribution_the_install_brings_in():
    """Transitively from nanonorm[dev], following the extras each requirement asks for (datasets' fsspec[http]
    brings aiohttp and its eight dependencies, which were left unpinned)."""
    import importlib.metadata as md

    pins = {line.split("==")[0].lower().replace("_", "-") for line in (REPO / "constraints.txt").read_text()
            .splitlines() if line.strip() and not line.startswith("#")}
    seen, todo = set(), [("nanonorm", ("dev",))]
    while todo:
        name, extras = todo.pop()
        key = (name.lower().replace("_", "-").replace(".", "-"), extras)
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        for spec in dist.requires or []:
            r = Requirement(spec)
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ("", *extras)):
                todo.append((r.name, tuple(sorted(r.extras))))
    installed = {n for n, _ in seen if n != "nanonorm"}
    known = {n for n in installed if _installed(n)}
    assert not known - pins, f"installed but not pinned: {sorted(known - pins)}"


def _installed(name: str) -> bool:
    import importlib.metadata as md

    try:
        md.distribution(name)
        return True
    except md.PackageNotFoundError:
        return False
