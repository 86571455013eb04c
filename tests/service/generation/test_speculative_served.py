"""Speculative decoding through the service: clients of the teacher see its own text and log-probabilities,
`auto` decides from step costs, the draft follows its student's versions under model control, and a
student's draft variant drafts while its fp32 answers."""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.test_app import metric_value
from tests.tiny_models import export_lm_pair


@pytest.fixture(scope="module")
def served(lm_pair: Path) -> Iterator[tuple[TestClient, TestClient]]:
    on = Settings(model_repository=lm_pair, speculative="on", speculative_tokens=3)
    off = Settings(model_repository=lm_pair, speculative="off")
    with TestClient(create_app(on)) as fast, TestClient(create_app(off)) as plain:
        yield fast, plain


def test_clients_see_the_teachers_text_and_the_metrics_say_what_the_drafts_bought(
    served: tuple[TestClient, TestClient],
) -> None:
    fast, plain = served
    for prompt in ("Acme was founded", "I loved this film", "Who"):
        body = {"model": "lm-teacher", "prompt": prompt, "max_new_tokens": 16}
        a, b = fast.post("/v1/generate", json=body), plain.post("/v1/generate", json=body)
        assert a.status_code == b.status_code == 200
        assert a.json()["generated_text"] == b.json()["generated_text"]
        completion = {"model": "lm-teacher", "prompt": prompt, "max_tokens": 8, "temperature": 0}
        c, d = fast.post("/v1/completions", json=completion), plain.post("/v1/completions", json=completion)
        assert c.json()["choices"][0]["text"] == d.json()["choices"][0]["text"]
    metrics = fast.get("/metrics").text
    drafted = metric_value(metrics, "distilserve_draft_tokens_total", model="lm-teacher")
    checks = metric_value(metrics, "distilserve_speculative_checks_total", model="lm-teacher")
    assert drafted > 0 and checks > 0
    assert metric_value(plain.get("/metrics").text, "distilserve_draft_tokens_total") == 0


def test_log_probabilities_are_the_teachers_own_under_drafting(served: tuple[TestClient, TestClient]) -> None:
    """Drafted tokens' log-probabilities come from the teacher's checking pass: the same as decoding alone."""
    fast, plain = served
    body = {
        "model": "lm-teacher",
        "prompt": "Acme was founded",
        "max_tokens": 12,
        "temperature": 0,
        "logprobs": 2,
    }
    a = fast.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    b = plain.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    assert a["tokens"] == b["tokens"] and len(a["tokens"]) == 12
    assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=1e-5)
    for mine, theirs in zip(a["top_logprobs"], b["top_logprobs"], strict=True):
        assert mine.keys() == theirs.keys() and list(mine.values()) == pytest.approx(
            list(theirs.values()), abs=1e-5
        )


def test_auto_leaves_a_draft_as_costly_as_its_teacher_off(
    lm_pair: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    caplog.set_level(logging.INFO)
    with TestClient(create_app(Settings(model_repository=lm_pair))) as c:
        body = {"model": "lm-teacher", "prompt": "Acme", "max_new_tokens": 4}
        assert c.post("/v1/generate", json=body).status_code == 200
        assert metric_value(c.get("/metrics").text, "distilserve_draft_tokens_total") == 0
    assert "speculative decoding off" in caplog.text  # the two tiny models are the same size


def stage_version_2(repository: Path, name: str, teacher_version: int | None = None) -> None:
    """Version 1 of `name` copied in as version 2 the way an export lands (renamed in whole); a student's
    manifest naming `teacher_version` of its teacher when given."""
    staging = repository / name / ".staging"
    shutil.copytree(repository / name / "1", staging)
    manifest = json.loads((staging / "manifest.json").read_text())
    manifest["version"] = 2
    if manifest.get("teacher") and teacher_version is not None:
        manifest["teacher"]["version"] = teacher_version
    (staging / "manifest.json").write_text(json.dumps(manifest))
    staging.rename(repository / name / "2")


def wait_for_served(client: TestClient, served: dict[str, int]) -> None:
    deadline = time.monotonic() + 30
    while {m["name"]: m["version"] for m in client.get("/v1/models").json()["models"]} != served:
        assert time.monotonic() < deadline, client.post("/v2/repository/index").json()
        time.sleep(0.05)


def teacher_drafted(client: TestClient) -> float:
    """Drafted tokens so far, after one more teacher request (which must succeed)."""
    body = {"model": "lm-teacher", "prompt": "Acme was founded", "max_new_tokens": 8}
    assert client.post("/v1/generate", json=body).status_code == 200
    return metric_value(client.get("/metrics").text, "distilserve_draft_tokens_total", model="lm-teacher")


def polled(lm_pair: Path, tmp_path: Path) -> tuple[Path, Settings]:
    repository = tmp_path / "models"
    shutil.copytree(lm_pair, repository)
    return repository, Settings(
        model_repository=repository, model_control="poll", repository_poll_s=0.1, speculative="on"
    )


def test_a_pair_exported_while_serving_drafts_too(lm_pair: Path, tmp_path: Path) -> None:
    """Under model control, a new teacher version loaded beside its new student gets the student as its
    draft before it starts (a teacher already decoding is never given one under its engine thread)."""
    repository, settings = polled(lm_pair, tmp_path)
    with TestClient(create_app(settings)) as c:
        for name in ("lm", "lm-teacher"):  # the pair, version 2 of both, the student naming teacher 2
            stage_version_2(repository, name, teacher_version=2)
        wait_for_served(c, {"lm": 2, "lm-teacher": 2})
        assert teacher_drafted(c) > 0


def test_a_serving_teacher_drafts_with_its_students_new_version_and_alone_once_it_is_gone(
    lm_pair: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="service.drafts")
    repository, settings = polled(lm_pair, tmp_path)
    with TestClient(create_app(settings)) as c:
        assert teacher_drafted(c) > 0  # drafting with lm v1
        stage_version_2(repository, "lm")  # the student's next version, for the same teacher
        wait_for_served(c, {"lm": 2, "lm-teacher": 1})
        assert "lm v2 drafts for lm-teacher from its next step" in caplog.text
        assert "lm v1 gone" not in caplog.text  # its successor had already taken over
        before = teacher_drafted(c)
        assert teacher_drafted(c) > before  # v2 drafts

        shutil.rmtree(repository / "lm")  # the student removed: the teacher goes on alone
        wait_for_served(c, {"lm-teacher": 1})
        assert "lm v2 gone, lm-teacher decodes alone" in caplog.text
        before = teacher_drafted(c)
        assert teacher_drafted(c) == before


@pytest.fixture(scope="module")
def drafting_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny pair with the student's draft variant beside its fp32 (export.variants.build_draft), its head
    cut to 16 of the 355 ids and the contexts' (common/draft_head.py)."""
    root = tmp_path_factory.mktemp("lm-draft-pair")
    return export_lm_pair(root, student_variants=("fp32", "draft"), draft_head_tokens=16)[0]


@pytest.mark.parametrize("draft", ["auto", "served"])
def test_a_students_draft_variant_drafts_and_the_text_stays_the_teachers(
    drafting_pair: Path, draft: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The draft variant only drafts: the student still answers in fp32, and the teacher's greedy text is
    its own whichever session drafted."""
    caplog.set_level(logging.INFO, logger="service.drafts")
    on = Settings(
        model_repository=drafting_pair, speculative="on", speculative_tokens=3, speculative_draft=draft
    )
    off = Settings(model_repository=drafting_pair, speculative="off")
    with TestClient(create_app(on)) as fast, TestClient(create_app(off)) as plain:
        for prompt in ("Acme was founded", "I loved this film", "Who"):
            body = {"model": "lm-teacher", "prompt": prompt, "max_new_tokens": 16}
            a, b = fast.post("/v1/generate", json=body), plain.post("/v1/generate", json=body)
            assert a.status_code == b.status_code == 200
            assert a.json()["generated_text"] == b.json()["generated_text"]
        metrics = fast.get("/metrics").text
        assert metric_value(metrics, "distilserve_draft_tokens_total", model="lm-teacher") > 0
        student = next(m for m in fast.get("/v1/models").json()["models"] if m["name"] == "lm")
        assert student["variant"] == "fp32" and "draft" in student["variants"]
    drafted_with = "its draft variant, its head 16 ids + the context's" if draft == "auto" else "fp32"
    assert f"speculative decoding: lm v1 ({drafted_with}) drafts for lm-teacher" in caplog.text


def test_a_draft_variant_that_does_not_load_leaves_the_student_serving(
    drafting_pair: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A draft graph ONNX Runtime cannot run (an older runtime without its operators, say) costs the
    drafting its speed, never the student its place: the variant it serves drafts instead."""
    from common.provenance import sha256_of

    repository = tmp_path / "models"
    shutil.copytree(drafting_pair, repository)
    version = repository / "lm" / "1"
    (version / "model.draft.onnx").write_bytes(b"not a graph")
    manifest = json.loads((version / "manifest.json").read_text())
    manifest["variants"]["draft"] |= {"sha256": sha256_of(version / "model.draft.onnx"), "size_bytes": 11}
    (version / "manifest.json").write_text(json.dumps(manifest))
    caplog.set_level(logging.INFO)
    settings = Settings(model_repository=repository, speculative="on", speculative_tokens=3)
    with TestClient(create_app(settings)) as client:
        for model in ("lm", "lm-teacher"):
            body = {"model": model, "prompt": "Acme was founded", "max_new_tokens": 8}
            assert client.post("/v1/generate", json=body).status_code == 200
    assert "lm v1: its draft variant did not load" in caplog.text
    assert "speculative decoding: lm v1 (fp32) drafts for lm-teacher" in caplog.text


def test_a_draft_whose_manifest_and_graph_disagree_on_its_head_leaves_the_served_variant_drafting(
    drafting_pair: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A manifest that no longer names the cut head its graph takes (hand-edited): the graph would be fed
    wrongly, so it is let go and the variant the student serves drafts; the teacher's text is its own."""
    repository = tmp_path / "models"
    shutil.copytree(drafting_pair, repository)
    manifest_file = repository / "lm" / "1" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["variants"]["draft"]["head_tokens"] = None
    manifest_file.write_text(json.dumps(manifest))
    caplog.set_level(logging.INFO)
    on = Settings(model_repository=repository, speculative="on", speculative_tokens=3)
    off = Settings(model_repository=repository, speculative="off")
    with TestClient(create_app(on)) as fast, TestClient(create_app(off)) as plain:
        body = {"model": "lm-teacher", "prompt": "Acme was founded", "max_new_tokens": 12}
        a, b = fast.post("/v1/generate", json=body), plain.post("/v1/generate", json=body)
        assert a.status_code == b.status_code == 200
        assert a.json()["generated_text"] == b.json()["generated_text"]
    assert "lm v1: its draft variant's graph takes context_token_ids, its manifest names no" in caplog.text
    assert "speculative decoding: lm v1 (fp32) drafts for lm-teacher" in caplog.text


def test_a_draft_variant_that_does_not_pay_is_released(drafting_pair: Path) -> None:
    """`auto` times the draft variant against its teacher; found too slow (the tiny two are the same size),
    the teacher decodes alone and the variant's session is let go rather than kept loaded for nothing."""
    from service.drafts import attach_drafts
    from service.generation.speculative import SpeculativeRunner
    from service.metrics import Metrics
    from service.repository import scan_repository
    from service.runtime import load_engine_model, ort_engine_factory

    settings = Settings(model_repository=drafting_pair, device="cpu")
    versions = {v.manifest.name: v for v in scan_repository(drafting_pair).versions}
    models = [load_engine_model(v, settings, Metrics(), ort_engine_factory) for v in versions.values()]
    student, teacher = (next(m for m in models if m.name == name) for name in ("lm", "lm-teacher"))
    assert student.draft_engine is not None  # loaded to be timed
    attach_drafts(models, settings)
    assert teacher.generation is not None
    assert not isinstance(teacher.generation.runner, SpeculativeRunner)
    assert student.draft_engine is None and student.engine is not None  # the student serves on
    for model in models:
        model.executor.shutdown()
