"""Shared fixtures: one tiny teacher/student pair and its exported repository per test session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# The servers tests start (`python -m service` in a subprocess inherits this) serve no gRPC unless a test
# asks for a port of its own: the default, 8001, is shared (SO_REUSEPORT) with any other server on it.
os.environ.setdefault("DISTILSERVE_GRPC_PORT", "0")


@pytest.fixture(scope="session")
def demo_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny classification teacher and its distilled student, trained in seconds on demo data."""
    from training.demo import build_demo_pair

    return build_demo_pair(tmp_path_factory.mktemp("demo"), quick=True, seed=0)


@pytest.fixture(scope="session")
def classification_repository(tmp_path_factory: pytest.TempPathFactory, demo_pair: tuple[Path, Path]) -> Path:
    """A model repository holding the student as `sentiment` v1 (every variant), exported with optimum."""
    from export.pipeline import export_model
    from export.variants import DEFAULT_VARIANTS

    repository = tmp_path_factory.mktemp("models")
    eval_data = demo_pair[1].parent.parent / "data" / "classification" / "eval.jsonl"
    result = export_model(
        demo_pair[1], "text-classification", "sentiment", repository, DEFAULT_VARIANTS, eval_data=eval_data
    )
    assert result.version_dir is not None, [r.problems for r in result.variants]
    return repository


TASKS = ("text-classification", "question-answering", "fill-mask", "text-generation")
TASK_MODEL_NAMES = {
    "text-classification": "tiny-cls",
    "question-answering": "tiny-qa",
    "fill-mask": "tiny-mlm",
    "text-generation": "tiny-lm",
}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An untrained tiny HF model directory per task (BERT heads and a GPT-2), seconds to build."""
    from tests.tiny_models import build_tiny

    root = tmp_path_factory.mktemp("tiny")
    return {task: build_tiny(task, root / task) for task in TASKS}


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny Llama HF directory: grouped-query attention (4 heads over 2 KV heads), rotary
    positions, RMSNorm, gated MLP, tied embeddings, a SmolLM2-like byte-level BPE and chat template."""
    from tests.tiny_models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model")


@pytest.fixture(scope="session")
def q4_llama(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny Llama 4-bit at its source (tests.tiny_models.build_q4_llama): its HF directory, and its
    version exported with fp32 and int4 (export/source_blocks.py), gated on the tiny corpus."""
    from export.pipeline import export_model
    from tests.tiny_models import CORPUS, build_q4_llama

    root = tmp_path_factory.mktemp("q4-llama")
    hf = build_q4_llama(tiny_llama_dir, root / "model")
    eval_text = root / "eval.txt"
    eval_text.write_text("\n".join(dict.fromkeys(CORPUS)) + "\n", encoding="utf-8")
    result = export_model(
        hf, "text-generation", "llama", root / "repo", ("fp32", "int4"), eval_data=eval_text
    )
    assert {r.variant: r.problems for r in result.variants} == {"fp32": [], "int4": []}
    assert result.version_dir is not None
    return hf, result.version_dir


@pytest.fixture(scope="session")
def tiny_repository(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> Path:
    """A model repository with one fp32 model per task, named as in TASK_MODEL_NAMES."""
    from export.pipeline import export_model

    repository = tmp_path_factory.mktemp("tiny-repo")
    for task, model_dir in tiny_models.items():
        result = export_model(model_dir, task, TASK_MODEL_NAMES[task], repository, ("fp32",))  # type: ignore[arg-type]
        assert result.version_dir is not None, [(r.variant, r.problems) for r in result.variants]
    return repository


@pytest.fixture(scope="session")
def optimum_lm_repository(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> Path:
    """The tiny GPT-2 exported as optimum's decoder (`present` = past + new), the graph every architecture
    but GPT-2 gets, so the engine is tested on both kinds of graph."""
    import export.tasks
    from export.pipeline import export_model

    repository = tmp_path_factory.mktemp("optimum-lm")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export.tasks, "appends", lambda config: False)
        result = export_model(
            tiny_models["text-generation"],
            "text-generation",
            TASK_MODEL_NAMES["text-generation"],
            repository,
            ("fp32",),
        )
    assert result.version_dir is not None, [(r.variant, r.problems) for r in result.variants]
    return repository


PAIR_NAMES = {"text-classification": "cls", "question-answering": "qa", "fill-mask": "mlm"}


def write_eval_data(task: str, out: Path) -> Path:
    """A small eval file of the task's format (training.data's loaders), from the tiny models' corpus."""
    import json

    from tests.tiny_models import CORPUS

    lines = sorted(set(CORPUS))
    if task == "text-classification":
        path = out / "eval.jsonl"
        rows = [{"text": f"{a} {b}", "label": i % 2} for i, a in enumerate(lines) for b in lines]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif task == "question-answering":
        path = out / "eval.json"
        context = " ".join(lines)
        qas = [
            {
                "id": f"q{i}",
                "question": q,
                "answers": [{"text": "John Smith", "answer_start": context.index("John")}],
            }
            for i, q in enumerate(
                ["Who founded Acme?", "When was it founded?", "Where is Springfield?", "Who?"]
            )
        ]
        path.write_text(
            json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]})
        )
    else:
        path = out / "eval.txt"
        path.write_text("\n".join(f"{a} {b}" for a in lines for b in lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def pair_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Per encoder task, an untrained tiny teacher (`<name>-teacher`) and a student of another seed paired
    with it (`<name>`, its cascade calibrated for 99 % agreement on the task's eval file)."""
    import json

    from export.pipeline import PairSpec, export_model
    from service.manifest import TeacherRef
    from tests.tiny_models import build_tiny

    root = tmp_path_factory.mktemp("pairs")
    repository = root / "models"
    for task, name in PAIR_NAMES.items():
        (root / task).mkdir()
        eval_data = write_eval_data(task, root / task)
        teacher_dir = build_tiny(task, root / task / "teacher", seed=0)
        student_dir = build_tiny(task, root / task / "student", seed=1)
        report = {  # what training writes beside a student: the export-time agreement live agreement meets
            "metric": "accuracy",
            "teacher": {"source": str(teacher_dir), "params": 1, "score": 0.5},
            "student": {"params": 1, "score": 0.5},
            "agreement": 0.5,
        }
        (student_dir / "distill_report.json").write_text(json.dumps(report), encoding="utf-8")
        teacher = export_model(
            teacher_dir, task, f"{name}-teacher", repository, ("fp32",), eval_data=eval_data
        )  # type: ignore[arg-type]
        assert teacher.version_dir is not None
        pair = PairSpec(TeacherRef(name=f"{name}-teacher", version=1), teacher_dir, 0.99)
        student = export_model(student_dir, task, name, repository, ("fp32",), eval_data=eval_data, pair=pair)  # type: ignore[arg-type]
        assert student.version_dir is not None and student.cascade is not None
    return repository


RANKING_QUERIES = ["who founded acme", "a film i loved", "where is springfield", "when was acme founded"]
RANKING_DOCUMENTS = [
    "Acme was founded by John Smith in 1950 in the city of Springfield.",
    "I loved this film, it was wonderful.",
    "A dull, terrible film. I hated every minute of it.",
    "the founders of acme",
    "film",
    "springfield is a city",
]
RANKING_WINDOW = 32  # tokens of a (query, document) pair the rankers read


@pytest.fixture(scope="session")
def ranking_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two untrained tiny cross-encoders (one label) of two seeds, exported as a pair (`ranker-teacher`,
    `ranker`) whose ranking cascade is calibrated for 99 % of queries on a pair file: each query with every
    of RANKING_DOCUMENTS, one more query with a single document (nothing to rank)."""
    import json

    from export.pipeline import PairSpec, export_model
    from service.manifest import TeacherRef
    from tests.tiny_models import build_cross_encoder

    root = tmp_path_factory.mktemp("ranking")
    eval_data = root / "eval.jsonl"
    rows = [{"text": q, "text_pair": d, "label": 0} for q in RANKING_QUERIES for d in RANKING_DOCUMENTS]
    rows.append({"text": "acme", "text_pair": RANKING_DOCUMENTS[0], "label": 0})
    eval_data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    teacher_dir = build_cross_encoder(root / "teacher", seed=0)
    student_dir = build_cross_encoder(root / "student", seed=1)
    repository = root / "models"
    window = {"eval_data": eval_data, "max_length": RANKING_WINDOW}
    teacher = export_model(
        teacher_dir, "text-classification", "ranker-teacher", repository, ("fp32",), **window
    )  # type: ignore[arg-type]
    assert teacher.version_dir is not None
    pair = PairSpec(TeacherRef(name="ranker-teacher", version=1), teacher_dir, 0.99)
    student = export_model(
        student_dir, "text-classification", "ranker", repository, ("fp32",), pair=pair, **window
    )  # type: ignore[arg-type]
    assert student.version_dir is not None and student.cascade is not None
    return {"repository": repository, "teacher": teacher_dir, "student": student_dir, "eval": eval_data}


EMBEDDING_STUDENT, EMBEDDING_TEACHER = "embed", "embed-teacher"


@pytest.fixture(scope="session")
def embedding_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two untrained tiny sentence encoders of two seeds exported as a pair (EMBEDDING_TEACHER, then
    EMBEDDING_STUDENT naming it), the student's distillation report giving `teacher_cosine` as PyTorch's mean
    over the eval sentences (`mean`)."""
    import json

    import numpy as np

    from export.pipeline import PairSpec, export_model
    from service.manifest import TeacherRef
    from tests.export.test_embeddings_export import build_sentence_model, write_sentences
    from tests.service.tasks.test_embeddings import torch_embeddings, unit

    root = tmp_path_factory.mktemp("embedding-pair")
    teacher = build_sentence_model(root / EMBEDDING_TEACHER)
    student = build_sentence_model(root / EMBEDDING_STUDENT, seed=1)
    sentences = write_sentences(root / "eval.txt")
    lines = sentences.read_text(encoding="utf-8").splitlines()
    mine, theirs = unit(torch_embeddings(student, lines)), unit(torch_embeddings(teacher, lines))
    mean = float(np.einsum("ij,ij->i", mine, theirs).mean())
    report = {  # the fields the export reads of training.distill_embeddings' report
        "task": "sentence-embeddings",
        "metric": "spearman",
        "eval": {"source": str(sentences), "examples": len(lines)},
        "teacher": {"source": str(teacher), "params": 2, "score": 0.8},
        "student": {"params": 1, "score": 0.7, "metrics": {"spearman": 0.7, "teacher_cosine": mean}},
        "agreement": 0.5,  # retrieval top-1 agreement: not the unit live checks count
    }
    (student / "distill_report.json").write_text(json.dumps(report), encoding="utf-8")
    repository = root / "models"
    export_model(teacher, "sentence-embeddings", EMBEDDING_TEACHER, repository, eval_data=sentences)
    spec = PairSpec(TeacherRef(name=EMBEDDING_TEACHER, version=1), teacher)
    export_model(
        student, "sentence-embeddings", EMBEDDING_STUDENT, repository, eval_data=sentences, pair=spec
    )
    return {"repository": repository, "teacher": teacher, "student": student, "mean": mean, "root": root}
