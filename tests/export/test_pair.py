"""A student exported as its teacher's pair: the manifest names the teacher and the calibrated cascade."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from common.cascade import at_threshold
from export.calibration import answers, calibration_inputs, masked_inputs
from export.cli import app
from export.tasks import SPECS, load_reference
from service.manifest import Manifest
from tests.conftest import PAIR_NAMES, write_eval_data
from tests.tiny_models import build_tiny


def manifest(repository: Path, name: str, version: int = 1) -> Manifest:
    return Manifest.model_validate_json((repository / name / str(version) / "manifest.json").read_text())


def test_the_students_manifest_names_its_teacher_and_a_threshold_meeting_the_target(
    pair_repository: Path,
) -> None:
    for name in PAIR_NAMES.values():
        student = manifest(pair_repository, name)
        assert student.teacher is not None and student.cascade is not None
        assert (student.teacher.name, student.teacher.version) == (f"{name}-teacher", 1)
        assert manifest(pair_repository, f"{name}-teacher").teacher is None
        c = student.cascade
        assert c.agreement >= c.target_agreement == 0.99
        assert c.fallback_rate > 0 and c.eval_examples > 0  # two seeds' untrained models disagree
        assert c.student_cost is not None and c.student_cost > 0  # timed: its size is the benchmarks' to say
        if c.paying_limit is not None:  # the most agreement a cascade cheaper than the teacher reaches
            assert c.paying_limit.fallback_rate + c.student_cost < 1
            assert c.paying_limit.agreement >= c.student_agreement


def test_calibration_reads_both_models_answers_as_the_service_scores_them(tmp_path: Path) -> None:
    task = "text-classification"
    eval_data = write_eval_data(task, tmp_path)
    student = load_reference(build_tiny(task, tmp_path / "s", seed=1), SPECS[task])
    inputs = calibration_inputs(task, eval_data, 100)
    found = answers(*student, task, inputs, 64)
    import torch

    with torch.no_grad():
        logits = student[0](**student[1](inputs, padding=True, return_tensors="pt")).logits.double()
    probabilities = torch.softmax(logits, dim=-1).numpy()
    np.testing.assert_allclose(found.confidence, probabilities.max(axis=-1), rtol=1e-9)
    assert found.best == probabilities.argmax(axis=-1).tolist()
    # the threshold the manifest would record does what it says on these answers
    checked = at_threshold(found.confidence, [True] * len(inputs), 0.5)
    assert checked.agreement == 1.0


def test_fill_mask_inputs_mask_one_word_of_each_line() -> None:
    lines = ["one two three four", "too short", "a b c"]
    masked = masked_inputs(lines)
    assert len(masked) == 2  # "too short" has two words
    for original, line in zip([lines[0], lines[2]], masked, strict=True):
        words, kept = original.split(), line.split()
        assert len(kept) == len(words) and sum(a != b for a, b in zip(words, kept, strict=True)) == 1


def test_the_cli_pairs_with_a_teacher_already_exported_without_exporting_it_again(
    pair_repository: Path, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    shutil.copytree(pair_repository / "cls-teacher", repository / "cls-teacher")
    task = "text-classification"
    eval_data = write_eval_data(task, tmp_path)
    teacher_dir = build_tiny(task, tmp_path / "teacher", seed=0)
    student_dir = build_tiny(task, tmp_path / "student", seed=1)
    common = [str(student_dir), "--task", task, "--name", "cls", "--repository", str(repository)]
    common += ["--variants", "fp32", "--teacher-dir", str(teacher_dir)]
    result = CliRunner().invoke(app, [*common, "--teacher", "cls-teacher:1", "--eval-data", str(eval_data)])
    assert result.exit_code == 0, result.output
    assert "paired with cls-teacher version 1: cascade threshold" in result.output
    assert sorted(p.name for p in (repository / "cls-teacher").iterdir()) == ["1"]  # not exported again
    written = json.loads((repository / "cls" / "1" / "manifest.json").read_text())
    assert written["teacher"] == {"name": "cls-teacher", "version": 1}

    missing = CliRunner().invoke(app, [*common, "--teacher", "nobody"])
    assert missing.exit_code == 1 and "holds no model 'nobody'" in missing.output
    wrong_version = CliRunner().invoke(app, [*common, "--teacher", "cls-teacher:7"])
    assert wrong_version.exit_code == 1 and "has no version 7" in wrong_version.output
    alone = CliRunner().invoke(app, [str(student_dir), "--task", task, "--name", "c", "--teacher", "x"])
    assert alone.exit_code == 2 and "--teacher-dir" in alone.output


def test_without_eval_data_the_pair_is_named_but_not_calibrated(tmp_path: Path) -> None:
    task = "fill-mask"
    repository = tmp_path / "models"
    teacher_dir = build_tiny(task, tmp_path / "teacher", seed=0)
    student_dir = build_tiny(task, tmp_path / "student", seed=1)
    args = [str(student_dir), "--task", task, "--name", "mlm", "--repository", str(repository)]
    result = CliRunner().invoke(app, [*args, "--variants", "fp32", "--teacher-dir", str(teacher_dir)])
    assert result.exit_code == 0, result.output
    student = manifest(repository, "mlm")
    assert student.teacher is not None and student.teacher.name == "mlm-teacher"  # exported first, v1
    assert student.cascade is None and "no cascade threshold was calibrated" in result.output


def test_draft_from_is_refused_where_no_draft_is_built(tmp_path: Path, tiny_llama_dir: Path) -> None:
    """--draft-from names where the draft variant comes from: without a draft to build (a teacher to draft
    for, the variant asked for) it is a mistake, said before anything is exported."""
    base = [str(tiny_llama_dir), "--task", "text-generation", "--name", "lm", "--repository", str(tmp_path)]
    lone = CliRunner().invoke(app, [*base, "--variants", "fp32,draft", "--draft-from", str(tiny_llama_dir)])
    assert lone.exit_code == 2 and "--teacher-dir" in lone.output
    paired = [*base, "--teacher-dir", str(tiny_llama_dir), "--variants", "fp32,draft"]
    nowhere = CliRunner().invoke(app, [*paired, "--draft-from", str(tmp_path / "nothing")])
    assert nowhere.exit_code == 2 and "not an HF model directory" in nowhere.output
    assert not any(tmp_path.iterdir())  # nothing exported


def test_a_cross_encoder_pair_is_calibrated_as_a_ranking_on_its_queries(
    ranking_pair: dict[str, Path],
) -> None:
    from common.cascade import calibrate_margin
    from tests.conftest import RANKING_DOCUMENTS, RANKING_QUERIES, RANKING_WINDOW
    from tests.service.tasks.test_cross_encoders import torch_logits

    c = manifest(ranking_pair["repository"], "ranker").cascade
    assert c is not None and c.confidence == "score-margin"
    groups = []  # the pair file's queries with their documents (the one-document query has nothing to rank)
    for query in RANKING_QUERIES:
        pairs: list[tuple[str, str] | str] = [(query, d) for d in RANKING_DOCUMENTS]
        groups.append(
            tuple(torch_logits(ranking_pair[m], pairs, window=RANKING_WINDOW) for m in ("student", "teacher"))
        )
    expected = calibrate_margin(groups, 0.99)  # type: ignore[arg-type]
    assert c.eval_examples == len(RANKING_QUERIES) == expected.examples
    assert c.threshold == pytest.approx(expected.threshold, abs=1e-4)
    assert (c.agreement, c.fallback_rate, c.student_agreement) == (
        expected.agreement,
        expected.fallback_rate,
        expected.student_agreement,
    )
    assert c.student_cost is not None and c.student_cost > 0
