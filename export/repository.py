"""Write a model version atomically: build in a hidden staging dir, then rename to the next version."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from service.manifest import MANIFEST_FILE, Manifest, TeacherRef


def existing_versions(model_root: Path) -> list[int]:
    if not model_root.is_dir():
        return []
    return sorted(int(p.name) for p in model_root.iterdir() if p.is_dir() and p.name.isdigit())


def next_version(model_root: Path) -> int:
    return max(existing_versions(model_root), default=0) + 1


def write_version(
    repository: Path,
    name: str,
    files: dict[str, Path],
    manifest_for: Callable[[int], Manifest],
    attempts: int = 5,
) -> Path:
    """Copy `files` (name in version dir -> source) and the manifest into `<repository>/<name>/<v>/`.

    Never overwrites: the rename fails if another writer took the version first, and we take the next one.
    A reader never sees a half-written version: staging dirs start with a dot and are ignored.
    """
    model_root = repository / name
    model_root.mkdir(parents=True, exist_ok=True)
    staging = model_root / f".staging-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        for target, source in files.items():
            shutil.copyfile(source, staging / target)
        for _ in range(attempts):
            version = next_version(model_root)
            manifest = manifest_for(version)
            (staging / MANIFEST_FILE).write_text(
                json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8"
            )
            final = model_root / str(version)
            try:
                staging.rename(final)  # atomic; fails on an existing non-empty dir
            except OSError:
                if final.exists():
                    continue
                raise
            return final
        raise RuntimeError(f"could not claim a new version under {model_root} after {attempts} attempts")
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def served_teacher(repository: Path, name: str, version: int | None = None) -> TeacherRef:
    """A teacher already in the repository, as a student's manifest names it: `version`, else the highest.

    Only a version whose manifest validates can be named: the service would not serve another."""
    versions = existing_versions(repository / name)
    if not versions:
        raise ValueError(f"{repository} holds no model {name!r} to pair with")
    chosen = max(versions) if version is None else version
    if chosen not in versions:
        raise ValueError(f"{name!r} has no version {chosen} in {repository} (has {versions})")
    path = repository / name / str(chosen) / MANIFEST_FILE
    Manifest.model_validate_json(path.read_text(encoding="utf-8"))
    return TeacherRef(name=name, version=chosen)
