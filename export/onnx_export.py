"""Export one task's graph (optimum's exporter, or distilserve's own graph where it has one) and describe
the graph written."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from service.manifest import Task, TensorDType, TensorSpec

log = logging.getLogger(__name__)

DEFAULT_OPSET = 17

OPTIMUM_TASK: dict[str, str] = {
    "text-classification": "text-classification",
    "question-answering": "question-answering",
    "fill-mask": "fill-mask",
    "text-generation": "text-generation-with-past",
}

_ONNX_DTYPES: dict[int, TensorDType] = {
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
}


def export_onnx(model_dir: Path, task: Task, out_dir: Path, opset: int | None = None) -> Path:
    """Export `model_dir` into `out_dir` (optimum's exporter; distilserve's own graphs for a GPT-2, the
    appending decoder, for fill-mask, the mask-scoring graph, and for sentence embeddings, the encoder with
    its pooling rule); returns the path of `model.onnx`, written beside the tokenizer and config files."""
    if task == "text-generation" and _appending(model_dir):
        return _export_appending(model_dir, out_dir, opset)
    if task == "fill-mask":
        return _export_mask_scoring(model_dir, out_dir, opset)
    if task == "sentence-embeddings":
        from export.sentence_embedding import export_sentence_embedding

        return export_sentence_embedding(model_dir, out_dir, opset or DEFAULT_OPSET)
    from optimum.exporters.onnx import main_export  # heavy: imported only when exporting

    main_export(
        model_name_or_path=str(model_dir),
        output=out_dir,
        task=OPTIMUM_TASK[task],
        opset=opset,
        device="cpu",
        do_validation=False,  # our own parity gate below is stricter and covers every variant
    )
    path = out_dir / "model.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"optimum wrote no model.onnx into {out_dir}")
    return path


def _appending(model_dir: Path) -> bool:
    from transformers import AutoConfig

    from export.tasks import appends

    return appends(AutoConfig.from_pretrained(model_dir))


def _export_mask_scoring(model_dir: Path, out_dir: Path, opset: int | None) -> Path:
    from export.mask_scoring import export_mask_scoring

    def write(model: Any, tokenizer: Any, path: Path) -> None:
        if tokenizer.mask_token_id is None:
            raise ValueError(f"{model_dir}: the tokenizer has no mask token, so nothing to fill")
        token_types = "token_type_ids" in tokenizer.model_input_names
        export_mask_scoring(model, tokenizer.mask_token_id, token_types, path, opset or DEFAULT_OPSET)

    return _export_own_graph(model_dir, out_dir, "AutoModelForMaskedLM", write)


def _export_appending(model_dir: Path, out_dir: Path, opset: int | None) -> Path:
    from export.appending_decoder import export_appending_decoder

    def write(model: Any, tokenizer: Any, path: Path) -> None:
        export_appending_decoder(model, path, opset or DEFAULT_OPSET)

    return _export_own_graph(model_dir, out_dir, "AutoModelForCausalLM", write)


def _export_own_graph(
    model_dir: Path, out_dir: Path, auto_class: str, write: Callable[[Any, Any, Path], None]
) -> Path:
    """One of distilserve's own graphs, written by `write(model, tokenizer, path)`, beside the model's
    config (the optimized variant's ORT optimizer reads the model type) and tokenizer, as optimum does."""
    import transformers

    out_dir.mkdir(parents=True, exist_ok=True)
    model = getattr(transformers, auto_class).from_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    path = out_dir / "model.onnx"
    write(model, tokenizer, path)
    model.config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return path


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor = value.type.tensor_type
    dtype = _ONNX_DTYPES.get(tensor.elem_type)
    if dtype is None:
        raise ValueError(f"graph tensor {value.name!r} has unsupported element type {tensor.elem_type}")
    shape: list[int | str] = [d.dim_param or d.dim_value for d in tensor.shape.dim]
    return TensorSpec(name=value.name, dtype=dtype, shape=shape)


def describe_graph(path: Path) -> tuple[list[TensorSpec], list[TensorSpec], int]:
    """Inputs, outputs and default-domain opset of an ONNX file (read without loading weights)."""
    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return [_spec(i) for i in model.graph.input], [_spec(o) for o in model.graph.output], opset
