"""Build the ONNX variants from the plain fp32 export; each is then judged by the parity gate."""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from export.parity import ParityReport

if TYPE_CHECKING:
    import onnx

VARIANT_FILES = {
    "fp32": "model.onnx",
    "optimized": "model.optimized.onnx",
    "int8": "model.int8.onnx",
    "fp16": "model.fp16.onnx",
    "draft": "model.draft.onnx",
    "int4": "model.int4.onnx",
}
VARIANT_PRECISION = {
    "fp32": "fp32",
    "optimized": "fp32",
    "int8": "int8",
    "fp16": "fp16",
    "draft": "int8",
    "int4": "int4",
}
VARIANT_DEVICE = {
    "fp32": "any",
    "optimized": "cpu",
    "int8": "cpu",
    "fp16": "gpu",
    "draft": "cpu",
    "int4": "cpu",
}
ALL_VARIANTS = tuple(VARIANT_FILES)
# What an export builds unless told: int4 only exists for a model that was 4-bit at its source (a GGUF
# import, export/source_blocks.py), so it is asked for by name.
DEFAULT_VARIANTS = tuple(v for v in ALL_VARIANTS if v != "int4")
# Variants a service runs only to draft for the model's teacher (speculative decoding), never to answer.
DRAFT_VARIANTS = frozenset({"draft"})


@dataclass
class VariantResult:
    """One variant built and put through the parity gate: passed when no problem was found."""

    variant: str
    path: Path
    parity: ParityReport
    problems: list[str]
    seconds: float
    size_bytes: int  # the graph file's
    recipe: str | None = None  # int8: the recipe this graph was quantized with (Int8Recipe)
    tried: list[str] = field(default_factory=list)  # int8: the recipes the gate refused first, and why
    data_bytes: int = 0  # its weights' file beside it, where they are not inside (export/onnx_files.py)
    source: str | None = None  # the checkpoint it was built from, where not the model's own (a draft)
    head_tokens: int | None = None  # a draft's cut output head (export/draft_head.py); None: the whole

    @property
    def passed(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class Int8Recipe:
    """How `build_int8` quantizes: which weights, at what grain; benchmarks/int8_recipes.py compares them.

    dynamic: ORT's dynamic quantization, int8 weights and activations quantized per tensor at run time
    (MatMulInteger), the fastest on CPU. weight-only: 8-bit weights in blocks of `block_size` along the
    input (ORT's MatMulNBits), activations quantized per block at run time (accuracy_level 4): finer than
    one scale per tensor, which is what BERT's outlier channels need (real SST-2 MiniLM students: top-1
    agreement 0.984-0.987 dynamic, 0.997 weight-only).
    """

    name: str = "dynamic"
    method: Literal["dynamic", "weight-only"] = "dynamic"
    per_channel: bool = True  # dynamic: a scale per output channel of each weight, not one per tensor
    reduce_range: bool = True  # dynamic: 7-bit weights (see build_int8)
    block_size: int = 128  # weight-only: input elements sharing a scale
    embeddings: bool = True  # also the embedding tables (Gather), except one tied to the output head
    # Nodes whose name one of these regular expressions finds stay fp32 (e.g. r"layer\.\d+/output/dense/":
    # BERT's feed-forward down projection, whose input is the GELU output with its outlier channels).
    keep_fp32: tuple[str, ...] = ()


DEFAULT_INT8 = Int8Recipe()
# What export tries, in this order, for the int8 variant: the first the parity gate passes is written
# ("blockwise": the weight-only method, named short for the export summary's 80 columns).
INT8_RECIPES = (DEFAULT_INT8, Int8Recipe("blockwise", method="weight-only"))
# The draft variant's: every weight 8-bit in blocks, the table and the output head too (see build_draft).
DRAFT_INT8 = Int8Recipe("draft", method="weight-only")
# The ids a draft's head scores besides the contexts' tokens (export/draft_head.py). SmolLM2's draft, engine
# alone, WikiText openings, 64 tokens (docs/benchmarks.md): the whole 49,152-token head 1.50x its teacher
# alone; cut to 1,024 / 2,048 / 4,096 / 8,192 first ids, 1.56x / 1.60x / 1.65x / 1.64x.
DRAFT_HEAD_TOKENS = 4096


def build_optimized(export_dir: Path, out: Path) -> None:
    """ORT's offline transformer fusions (level 2: attention, layer-norm, GELU) for CPU serving."""
    from optimum.onnxruntime import ORTOptimizer
    from optimum.onnxruntime.configuration import OptimizationConfig

    work = export_dir.parent / "optimized"
    ORTOptimizer.from_pretrained(export_dir).optimize(
        save_dir=work, optimization_config=OptimizationConfig(optimization_level=2, optimize_for_gpu=False)
    )
    shutil.move(work / "model_optimized.onnx", out)


def build_int8(fp32: Path, out: Path, recipe: Int8Recipe = DEFAULT_INT8) -> None:
    """Dynamic int8 of the plain export (quantizing an optimized graph fails, see FACTS.md): the weights
    of the matrix multiplies, per output channel on 7 bits, and the embedding tables.

    ORT's defaults quantized the attention's activation x activation products (accuracy lost, nothing
    gained) and skipped Gemm, which is how GPT-2's Conv1D layers export, so a GPT-2 kept its layers in
    fp32; Gemms are rewritten as MatMul + Add first. Seven-bit weights keep AVX2 machines without VNNI
    from saturating their 16-bit sums (on the demo QA student, 8-bit per-tensor weights: top-1 0.989,
    7-bit per-channel: 0.995). An embedding table that is also the output head (GPT-2's tied `wte`)
    stays fp32: quantizing it coarsens every logit (demo LM top-1 0.984 instead of 0.993). Linear layers
    (Llama's) export as MatMul over a Transpose of the weight, which the quantizer does not see as a
    constant: those transposes are folded into the weights first.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from export.onnx_files import ONE_FILE_BYTES, save, weight_bytes

    if recipe.method not in ("dynamic", "weight-only"):
        raise ValueError(f"unknown int8 method {recipe.method!r}")
    model = onnx.load(str(fp32))
    gemms_as_matmuls(model.graph)
    fold_weight_transposes(model.graph)
    kept = [n.name for n in model.graph.node if any(re.search(p, n.name) for p in recipe.keep_fp32)]
    with tempfile.TemporaryDirectory() as tmp:
        rewritten = Path(tmp) / "model.onnx"
        if recipe.method == "weight-only":
            model = _weight_only(model, recipe.block_size, kept)
        quantized_bytes = weight_bytes(model) // 4  # at most: what stays fp32 is small
        save(model, rewritten)
        matmuls = ["MatMul"] if recipe.method == "dynamic" else []
        embeddings = ["Gather"] if recipe.embeddings else []
        if not matmuls + embeddings:
            save(onnx.load(str(rewritten)), out)
            return
        quantize_dynamic(
            rewritten,
            out,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=matmuls + embeddings,
            nodes_to_exclude=tied_embedding_lookups(model.graph) + kept,
            per_channel=recipe.per_channel,
            reduce_range=recipe.reduce_range,
            # ONNX Runtime names the weights' file as export.onnx_files does (`out` + ".data")
            use_external_data_format=quantized_bytes > ONE_FILE_BYTES,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True},
        )


def _weight_only(model: onnx.ModelProto, block_size: int, kept: list[str]) -> onnx.ModelProto:
    """Every MatMul with a constant weight as MatMulNBits: 8-bit symmetric weights in blocks, int8 compute."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(
        logging.WARNING
    )  # a line a node
    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, accuracy_level=4, bits=8)
    quantizer = MatMulNBitsQuantizer(
        model,
        bits=8,
        block_size=block_size,
        is_symmetric=True,
        accuracy_level=4,
        nodes_to_exclude=kept,
        algo_config=config,
    )
    quantizer.process()
    result: onnx.ModelProto = quantizer.model.model
    return result


def tied_embedding_lookups(graph: onnx.GraphProto) -> list[str]:
    """Gather nodes reading a table that some other node reads too (an output head tied to it)."""
    weights = {init.name for init in graph.initializer}
    uses = Counter(name for node in graph.node for name in node.input)
    return [
        node.name
        for node in graph.node
        if node.op_type == "Gather" and node.input[0] in weights and uses[node.input[0]] > 1
    ]


def fold_weight_transposes(graph: onnx.GraphProto) -> None:
    """Replace each Transpose of a weight that nothing else reads by the transposed weight, in place, so
    the MatMul after it has a constant input to quantize. A weight read elsewhere too (an embedding table
    tied to the output head) keeps its Transpose, and so stays fp32 in the head."""
    from onnx import helper, numpy_helper

    weights = {init.name: init for init in graph.initializer}
    uses = Counter(name for node in graph.node for name in node.input)
    outputs = {value.name for value in graph.output}
    nodes = []
    for node in graph.node:
        source = node.input[0] if node.op_type == "Transpose" else None
        if source not in weights or uses[source] > 1 or node.output[0] in outputs:
            nodes.append(node)
            continue
        weight = weights.pop(source)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        array = numpy_helper.to_array(weight)
        folded = numpy_helper.from_array(array.transpose(attrs.get("perm")).copy(), node.output[0])
        weight.CopyFrom(folded)  # the same initializer slot, now named as the Transpose's output
    graph.ClearField("node")
    graph.node.extend(nodes)


def gemms_as_matmuls(graph: onnx.GraphProto) -> None:
    """Rewrite each plain Gemm with a constant weight (Y = A @ B(.T) + C) as MatMul + Add, in place,
    so dynamic quantization, which has no integer Gemm, covers it. Other Gemms are left as they are."""
    from onnx import helper, numpy_helper

    weights = {init.name: init for init in graph.initializer}
    uses = Counter(name for node in graph.node for name in node.input)
    nodes = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        plain = attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 and not attrs.get("transA")
        if node.op_type != "Gemm" or not plain or node.input[1] not in weights:
            nodes.append(node)
            continue
        inputs = list(node.input)
        if attrs.get("transB"):  # the weight transposed once, here, instead of at every call
            weight = weights[inputs[1]]
            transposed = numpy_helper.from_array(numpy_helper.to_array(weight).T.copy(), weight.name)
            if uses[weight.name] > 1:  # shared with another node: keep the original beside it
                transposed.name = inputs[1] = f"{weight.name}/transposed"
                graph.initializer.append(transposed)
            else:
                weight.CopyFrom(transposed)
        product = f"{node.output[0]}/matmul"
        nodes.append(helper.make_node("MatMul", inputs[:2], [product], name=f"{node.name}/MatMul"))
        if len(inputs) > 2 and inputs[2]:
            nodes.append(
                helper.make_node("Add", [product, inputs[2]], node.output[:1], name=f"{node.name}/Add")
            )
        else:
            nodes[-1].output[0] = node.output[0]
    graph.ClearField("node")
    graph.node.extend(nodes)


def build_draft(fp32: Path, out: Path, head_tokens: int | None = DRAFT_HEAD_TOKENS) -> int | None:
    """A generation student's graph for drafting only: its output head untied from the embedding table and
    every weight, both of them included, 8-bit in blocks (DRAFT_INT8); the head then cut to the first
    `head_tokens` ids plus the contexts' (export/draft_head.py; None or 0: never cut). Returns the cut
    head's `head_tokens`, None where the head scores the whole vocabulary.

    A draft's tokens are all checked by the teacher, so its precision changes the speed, never the text;
    what it costs is each decode step. The int8 variant keeps a tied head in fp32 (quantizing it coarsens
    every answer): SmolLM2's 12-layer student, int8 everywhere else, still reads the 49,152 x 576 head in
    fp32 at each step, and its step cost 0.31 of the teacher's; with the head in 8 bits, 0.20 (and 0.52 in
    fp32), at a top-1 agreement with fp32 of 0.93. Cut to 4,096 ids and the contexts', 3.3 -> 2.4 ms."""
    import onnx

    from export.draft_head import restrict_head
    from export.onnx_files import save

    model = onnx.load(str(fp32))
    untie_embeddings(model.graph)
    with tempfile.TemporaryDirectory() as tmp:
        untied = Path(tmp) / "model.onnx"
        save(model, untied)
        build_int8(untied, out, DRAFT_INT8)
    if not head_tokens:
        return None
    quantized = onnx.load(str(out))
    if not restrict_head(quantized, head_tokens):
        return None  # a vocabulary no larger than the cut
    save(quantized, out)
    return head_tokens


def untie_embeddings(graph: onnx.GraphProto) -> None:
    """Each embedding lookup (Gather) that reads a weight some other node reads too (an output head tied to
    it) gets its own copy of the table, in place: both can then be quantized, each its own way."""
    from onnx import numpy_helper

    weights = {init.name: init for init in graph.initializer}
    for name in tied_embedding_lookups(graph):
        node = next(n for n in graph.node if n.name == name)
        table = weights[node.input[0]]
        copy = numpy_helper.from_array(numpy_helper.to_array(table), f"{table.name}/lookup")
        graph.initializer.append(copy)
        node.input[0] = copy.name


def build_fp16(fp32: Path, out: Path) -> None:
    """fp16 weights and compute, fp32 inputs and outputs (clients and the KV cache keep one dtype)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from export.onnx_files import save

    save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), out)


def build_variant(variant: str, export_dir: Path, fp32: Path, out_dir: Path) -> Path:
    out = out_dir / VARIANT_FILES[variant]
    if variant == "optimized":
        build_optimized(export_dir, out)
    elif variant == "int8":
        build_int8(fp32, out)
    elif variant == "fp16":
        build_fp16(fp32, out)
    else:  # a draft is built by build_draft (with the head cut the pipeline chose), int4 by build_int4
        raise ValueError(f"unknown variant {variant!r}")
    return out
