"""The manifest of an exported version: what the service reads of it (service.manifest), built from the
export's graph, tokenizer, the variants the gate passed, and the student's distillation report."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.provenance import git_revision, sha256_of
from export.chat import chat_spec
from export.onnx_export import describe_graph
from export.onnx_files import external_data
from export.tasks import TaskSpec
from export.variants import DRAFT_VARIANTS, VARIANT_DEVICE, VARIANT_FILES, VARIANT_PRECISION
from service.manifest import (
    CascadeCalibration,
    DistillationRecord,
    ExternalData,
    GenerationLayout,
    Manifest,
    ModelScore,
    SpecialTokens,
    TeacherRef,
    TokenizerSpec,
    VariantSpec,
)

if TYPE_CHECKING:
    from export.variants import VariantResult


def external_data_spec(graph: Path) -> ExternalData | None:
    """The file beside `graph` holding its weights, as the manifest lists it (None: they are inside it)."""
    data = external_data(graph)
    if data is None:
        return None
    return ExternalData(file=data.name, size_bytes=data.stat().st_size, sha256=sha256_of(data))


def distillation_record(model_dir: Path) -> DistillationRecord | None:
    """The student's `distill_report.json` (written by training/), if there is one."""
    path = model_dir / "distill_report.json"
    if not path.is_file():
        return None
    report = json.loads(path.read_text(encoding="utf-8"))
    teacher, student = report.get("teacher", {}), report.get("student", {})
    evaluation = report.get("eval", {})
    cosine = student.get("metrics", {}).get("teacher_cosine")  # training.distill_embeddings writes it
    return DistillationRecord(
        metric=str(report.get("metric", "score")),
        teacher=ModelScore(
            source=str(teacher.get("source", "?")), params=teacher["params"], score=teacher.get("score")
        ),
        student=ModelScore(source=str(model_dir), params=student["params"], score=student.get("score")),
        agreement=report.get("agreement"),
        eval_source=evaluation.get("source"),
        eval_examples=evaluation.get("examples"),
        teacher_cosine=None if cosine is None else min(1.0, max(-1.0, float(cosine))),  # float error past 1
    )


def manifest_builder(
    name: str,
    spec: TaskSpec,
    model: Any,
    tokenizer: Any,
    max_length: int,
    passed: dict[str, VariantResult],
    rejected: dict[str, str],
    fp32: Path,
    tokenizer_file: Path,
    layout: GenerationLayout | None,
    model_dir: Path,
    teacher: TeacherRef | None,
    cascade: CascadeCalibration | None,
) -> Callable[[int], Manifest]:
    """The manifest for the version number the repository gives the export (known only when written)."""
    inputs, outputs, opset_used = describe_graph(fp32)
    variant_specs = {
        v: VariantSpec(
            file=VARIANT_FILES[v],
            precision=VARIANT_PRECISION[v],  # type: ignore[arg-type]
            device=VARIANT_DEVICE[v],  # type: ignore[arg-type]
            optimized=v == "optimized",
            size_bytes=r.size_bytes,
            sha256=sha256_of(r.path),
            parity=r.parity.as_dict(),
            recipe=r.recipe,
            refused_recipes=r.tried,
            drafts_only=v in DRAFT_VARIANTS,
            data=external_data_spec(r.path),
            source=r.source,
            head_tokens=r.head_tokens,
        )
        for v, r in passed.items()
    }
    special = SpecialTokens(
        pad=tokenizer.pad_token_id,
        cls=tokenizer.cls_token_id,
        sep=tokenizer.sep_token_id,
        mask=tokenizer.mask_token_id,
        unk=tokenizer.unk_token_id,
        bos=tokenizer.bos_token_id,
        eos=tokenizer.eos_token_id,
    )
    chat = chat_spec(tokenizer) if spec.task == "text-generation" else None  # None: completions only
    embedding = None
    if spec.task == "sentence-embeddings":
        from export.sentence_embedding import embedding_spec  # torch: imported only when exporting

        embedding = embedding_spec(model)
    id2label = getattr(model.config, "id2label", None) or {}
    labels = {int(k): str(v) for k, v in id2label.items()} if spec.task == "text-classification" else {}
    tokenizer_spec = TokenizerSpec(
        sha256=sha256_of(tokenizer_file),
        max_length=max_length,
        pad_token_id=tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None
        else (layout.pad_token_id if layout else 0) or 0,
        lowercase=getattr(tokenizer, "do_lower_case", None),
    )

    def manifest_for(version: int) -> Manifest:
        return Manifest(
            name=name,
            version=version,
            task=spec.task,
            labels=labels,
            max_sequence_length=max_length,
            inputs=inputs,
            outputs=outputs,
            variants=variant_specs,
            rejected_variants=rejected,
            tokenizer=tokenizer_spec,
            special_tokens=special,
            generation=layout,
            chat=chat,
            embedding=embedding,
            distillation=distillation_record(model_dir),
            teacher=teacher,
            cascade=cascade,
            opset=opset_used,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            git_revision=git_revision(),
            source_model=str(model_dir),
        )

    return manifest_for
