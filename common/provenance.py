"""Where an artefact came from: a file's checksum (the repository's manifests), the code's git revision
(training reports and export manifests). Standard library only."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def git_revision() -> str | None:
    """The commit this code was run from (with `+dirty` if the tree has changes), or None outside git."""
    here = Path(__file__).resolve().parent  # this checkout, whichever stage asks
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # read-only: `git status` must not touch the index

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=here, env=env, capture_output=True, text=True, timeout=5, check=True
        )
        return done.stdout.strip()

    try:
        rev = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{rev}+dirty" if dirty else rev or None
