"""An older revision is served a repository it can read: fields its manifest schema refuses are left out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks.revisions import repository_for
from service.repository import scan_repository
from tests.conftest import TASK_MODEL_NAMES

ROOT = Path(__file__).resolve().parents[2]


def test_fields_the_older_schema_does_not_know_are_dropped_and_the_models_linked(
    tiny_repository: Path, tmp_path: Path
) -> None:
    newer = tmp_path / "newer"
    shutil.copytree(tiny_repository, newer)
    manifest_file = newer / TASK_MODEL_NAMES["text-generation"] / "1" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["added_later"] = {"by": "a newer export"}
    manifest["generation"]["also_added_later"] = 1
    manifest_file.write_text(json.dumps(manifest))
    assert scan_repository(newer).errors  # this tree's own schema refuses them too: it plays the older one

    copy = repository_for(ROOT, newer, tmp_path / "copy")

    scan = scan_repository(copy)
    assert not scan.errors
    assert sorted(v.manifest.name for v in scan.versions) == sorted(TASK_MODEL_NAMES.values())
    kept = json.loads((copy / TASK_MODEL_NAMES["text-generation"] / "1" / "manifest.json").read_text())
    assert "added_later" not in kept and "also_added_later" not in kept["generation"]
    assert kept["generation"] == {k: v for k, v in manifest["generation"].items() if k != "also_added_later"}
    model = copy / TASK_MODEL_NAMES["text-generation"] / "1" / "model.onnx"
    assert model.is_symlink() and model.resolve() == (newer / model.relative_to(copy)).resolve()
