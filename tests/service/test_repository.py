"""The service's reader of the model repository: valid versions load, broken ones are named and refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from service.manifest import Manifest
from service.repository import RepositoryError, read_version, scan_repository


def copy_version(repository: Path, tmp_path: Path) -> Path:
    target = tmp_path / "models"
    shutil.copytree(repository, target)
    return target / "sentiment" / "1"


def test_a_valid_export_reads_back_with_its_manifest(classification_repository: Path) -> None:
    scan = scan_repository(classification_repository)
    assert scan.errors == []
    [version] = scan.versions
    m = version.manifest
    assert (m.name, m.version, m.task) == ("sentiment", 1, "text-classification")
    assert set(m.labels.values()) == {"negative", "positive"}
    assert {"fp32", "int8"} <= set(m.variants)
    assert [t.name for t in m.inputs][:2] == ["input_ids", "attention_mask"]
    assert m.distillation is not None and m.distillation.teacher.params > m.distillation.student.params


@pytest.mark.parametrize("missing", ["manifest.json", "model.onnx", "tokenizer.json"])
def test_a_missing_file_is_rejected_naming_it(
    classification_repository: Path, tmp_path: Path, missing: str
) -> None:
    version_dir = copy_version(classification_repository, tmp_path)
    (version_dir / missing).unlink()
    with pytest.raises(RepositoryError) as err:
        read_version(version_dir)
    assert err.value.path == version_dir / missing
    assert "missing" in str(err.value)


def test_a_corrupt_model_file_is_rejected(classification_repository: Path, tmp_path: Path) -> None:
    version_dir = copy_version(classification_repository, tmp_path)
    model = version_dir / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(RepositoryError, match=r"model\.onnx: sha256 does not match"):
        read_version(version_dir)


def test_a_truncated_file_is_rejected_by_size(classification_repository: Path, tmp_path: Path) -> None:
    version_dir = copy_version(classification_repository, tmp_path)
    model = version_dir / "model.int8.onnx"
    model.write_bytes(model.read_bytes()[:100])
    with pytest.raises(RepositoryError, match=r"model\.int8\.onnx: size is 100 bytes"):
        read_version(version_dir)


def test_invalid_json_and_schema_errors_name_the_manifest(
    classification_repository: Path, tmp_path: Path
) -> None:
    version_dir = copy_version(classification_repository, tmp_path)
    manifest = version_dir / "manifest.json"
    manifest.write_text("{not json")
    with pytest.raises(RepositoryError, match=r"manifest\.json: not valid JSON"):
        read_version(version_dir)

    raw = json.loads((classification_repository / "sentiment" / "1" / "manifest.json").read_text())
    raw["task"] = "translation"
    del raw["max_sequence_length"]
    manifest.write_text(json.dumps(raw))
    with pytest.raises(RepositoryError) as err:
        read_version(version_dir)
    assert "task" in err.value.problem and "max_sequence_length" in err.value.problem


def test_a_manifest_that_disagrees_with_its_directory_is_rejected(
    classification_repository: Path, tmp_path: Path
) -> None:
    version_dir = copy_version(classification_repository, tmp_path)
    moved = version_dir.parent / "7"
    version_dir.rename(moved)
    with pytest.raises(RepositoryError, match="version 1 but directory '7'"):
        read_version(moved)


def test_scan_keeps_good_versions_and_reports_broken_ones(
    classification_repository: Path, tmp_path: Path
) -> None:
    version_dir = copy_version(classification_repository, tmp_path)
    broken = version_dir.parent / "2"
    shutil.copytree(version_dir, broken)
    raw = json.loads((broken / "manifest.json").read_text())
    raw["version"] = 2
    (broken / "manifest.json").write_text(json.dumps(raw))
    (broken / "tokenizer.json").unlink()
    (version_dir.parent / ".staging-abc").mkdir()  # an export in progress is invisible
    scan = scan_repository(version_dir.parent.parent)
    assert [v.version for v in scan.versions] == [1]
    assert len(scan.errors) == 1 and scan.errors[0].path == broken / "tokenizer.json"


def test_scan_of_a_missing_repository_says_so(tmp_path: Path) -> None:
    scan = scan_repository(tmp_path / "nowhere")
    assert scan.versions == [] and "does not exist" in str(scan.errors[0])


def test_manifest_schema_requires_task_extras() -> None:
    with pytest.raises(ValueError, match="labels"):
        Manifest.model_validate(
            {
                "name": "x",
                "version": 1,
                "task": "text-classification",
                "max_sequence_length": 8,
                "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["b", "s"]}],
                "outputs": [{"name": "logits", "dtype": "float32", "shape": ["b", 2]}],
                "variants": {
                    "fp32": {"file": "model.onnx", "precision": "fp32", "size_bytes": 1, "sha256": "0" * 64}
                },
                "tokenizer": {"sha256": "0" * 64, "max_length": 8, "pad_token_id": 0},
            }
        )
