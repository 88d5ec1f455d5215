"""Where a result comes from: the code's git commit, recorded in every run's summary."""
from __future__ import annotations

from pathlib import Path
from typing import Optional


def code_commit(repo: Optional[Path] = None) -> Optional[str]:
    """The git commit of the checkout at `repo` (default: this code's), '+dirty' if tracked files
    changed, for the summary record; None outside a git checkout. Once per run, at its end."""
    import subprocess

    repo = repo or Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")
