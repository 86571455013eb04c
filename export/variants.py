"""Build the ONNX variants from the plain fp32 export; each is then judged by the parity gate."""

from __future__ import annotations

import shutil
from pathlib import Path

VARIANT_FILES = {
    "fp32": "model.onnx",
    "optimized": "model.optimized.onnx",
    "int8": "model.int8.onnx",
    "fp16": "model.fp16.onnx",
}
VARIANT_PRECISION = {"fp32": "fp32", "optimized": "fp32", "int8": "int8", "fp16": "fp16"}
VARIANT_DEVICE = {"fp32": "any", "optimized": "cpu", "int8": "cpu", "fp16": "gpu"}
ALL_VARIANTS = tuple(VARIANT_FILES)


def build_optimized(export_dir: Path, out: Path) -> None:
    """ORT's offline transformer fusions (level 2: attention, layer-norm, GELU) for CPU serving."""
    from optimum.onnxruntime import ORTOptimizer
    from optimum.onnxruntime.configuration import OptimizationConfig

    work = export_dir.parent / "optimized"
    ORTOptimizer.from_pretrained(export_dir).optimize(
        save_dir=work, optimization_config=OptimizationConfig(optimization_level=2, optimize_for_gpu=False)
    )
    shutil.move(work / "model_optimized.onnx", out)


def build_int8(fp32: Path, out: Path) -> None:
    """Dynamic int8 of the plain export (quantizing an optimized graph fails, see FACTS.md)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        fp32, out, weight_type=QuantType.QInt8, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT}
    )


def build_fp16(fp32: Path, out: Path) -> None:
    """fp16 weights and compute, fp32 inputs and outputs (clients and the KV cache keep one dtype)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True)
    onnx.save(model, str(out))


def build_variant(variant: str, export_dir: Path, fp32: Path, out_dir: Path) -> Path:
    out = out_dir / VARIANT_FILES[variant]
    if variant == "optimized":
        build_optimized(export_dir, out)
    elif variant == "int8":
        build_int8(fp32, out)
    elif variant == "fp16":
        build_fp16(fp32, out)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    return out
