"""Find, validate and describe the model versions in a repository; reject a broken one by name."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from common.provenance import sha256_of
from service.manifest import MANIFEST_FILE, Manifest

log = logging.getLogger(__name__)


class RepositoryError(Exception):
    """A model version that cannot be served; the message names the file and the problem."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclass(frozen=True)
class ModelVersion:
    manifest: Manifest
    directory: Path

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version(self) -> int:
        return self.manifest.version

    def file(self, relative: str) -> Path:
        return self.directory / relative


class OfVersion:
    """What a model version's holders (the engine's and a frontend's) read through it."""

    version: ModelVersion

    @property
    def manifest(self) -> Manifest:
        return self.version.manifest

    @property
    def name(self) -> str:
        return self.version.manifest.name


@dataclass
class RepositoryScan:
    versions: list[ModelVersion] = field(default_factory=list)
    errors: list[RepositoryError] = field(default_factory=list)


def _check_file(path: Path, sha256: str, size: int | None) -> None:
    if size is not None and path.stat().st_size != size:
        raise RepositoryError(path, f"size is {path.stat().st_size} bytes, manifest says {size} (corrupt?)")
    if sha256_of(path) != sha256:
        raise RepositoryError(path, "sha256 does not match the manifest (corrupt or replaced file)")


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise RepositoryError(path, "manifest.json is missing")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RepositoryError(path, f"not valid JSON ({e})") from e
    try:
        return Manifest.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or '<root>'}: {err['msg']}" for err in e.errors()
        )
        raise RepositoryError(path, f"does not match the manifest schema: {problems}") from e


def read_version(directory: Path, verify_checksums: bool = True) -> ModelVersion:
    """Validate one `<name>/<version>/` directory: manifest, naming, and every file it lists."""
    manifest = read_manifest(directory)
    manifest_path = directory / MANIFEST_FILE
    if manifest.name != directory.parent.name:
        raise RepositoryError(
            manifest_path, f"name {manifest.name!r} but directory {directory.parent.name!r}"
        )
    if str(manifest.version) != directory.name:
        raise RepositoryError(manifest_path, f"version {manifest.version} but directory {directory.name!r}")
    listed: list[tuple[str, str, int | None]] = [(manifest.tokenizer.file, manifest.tokenizer.sha256, None)]
    listed += [(v.file, v.sha256, v.size_bytes) for v in manifest.variants.values()]
    listed += [(v.data.file, v.data.sha256, v.data.size_bytes) for v in manifest.variants.values() if v.data]
    for relative, sha256, size in listed:
        path = directory / relative
        if not path.is_file():
            raise RepositoryError(path, "file is missing")
        if verify_checksums:
            _check_file(path, sha256, size)
    return ModelVersion(manifest=manifest, directory=directory)


def scan_repository(root: Path, verify_checksums: bool = True) -> RepositoryScan:
    """Every `<name>/<integer>/` under root; hidden dirs (an export in progress) are ignored."""
    scan = RepositoryScan()
    if not root.is_dir():
        scan.errors.append(RepositoryError(root, "model repository directory does not exist"))
        return scan
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for version_dir in sorted(
            p for p in model_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
        ):
            if not version_dir.name.isdigit():
                log.warning("ignoring %s: version directories are integers", version_dir)
                continue
            try:
                scan.versions.append(read_version(version_dir, verify_checksums))
            except RepositoryError as e:
                scan.errors.append(e)
    return scan
