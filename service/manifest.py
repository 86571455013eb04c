"""The model-repository contract: one pydantic schema for `manifest.json`.

Export writes it, the service reads it; this module imports nothing heavy so both sides can share it.
A version directory looks like:

    models/<name>/<version>/manifest.json, model.onnx [, model.int8.onnx, model.fp16.onnx], tokenizer.json

A text-generation manifest may carry the model's chat template (`chat`, see ChatTemplateSpec); without one the
model serves completions only. `python -m export.chat HF_DIR VERSION_DIR` adds it to a version exported
before the field existed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MANIFEST_FILE = "manifest.json"

Task = Literal[
    "text-classification", "question-answering", "fill-mask", "text-generation", "sentence-embeddings"
]
TensorDType = Literal["int64", "int32", "float32", "float16"]
Precision = Literal["fp32", "fp16", "int8", "int4"]
Device = Literal["cpu", "gpu", "any"]


MODEL_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"  # a path segment and a URL segment, never "." or ".."


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Strict):
    """One graph input or output; symbolic dims are strings such as "batch" or "sequence"."""

    name: str
    dtype: TensorDType
    shape: list[int | str]


class ExternalData(_Strict):
    """A variant's weights beside its graph (ONNX external data: a model past protobuf's 2 GB a file), named
    as the graph names it; checked as the graph is."""

    file: str
    size_bytes: int = Field(gt=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class VariantSpec(_Strict):
    """One ONNX file of the model and the evidence that it matches the PyTorch reference."""

    file: str
    precision: Precision
    device: Device = "any"
    optimized: bool = False
    size_bytes: int = Field(gt=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    parity: dict[str, float] = Field(default_factory=dict)
    recipe: str | None = None  # how it was quantized (int8: export.variants.Int8Recipe's name)
    refused_recipes: list[str] = Field(default_factory=list)  # recipes the parity gate refused first, and why
    # Run only to draft for the model's teacher (speculative decoding), never to answer: the teacher checks
    # every token it proposes, so it may keep fewer of its model's answers than a served variant must.
    drafts_only: bool = False
    data: ExternalData | None = None  # where its weights are not inside `file` (None: they are)
    # The checkpoint it was built from where not the model's own: a draft from a copy of the student tuned
    # to draft (export --draft-from), so that the student keeps answering with its own weights.
    source: str | None = None
    # A draft whose output head scores only the ids below this, and the running contexts' ids fed with each
    # call (common/draft_head.py: a draft step reads a fraction of the head); None: the whole vocabulary.
    head_tokens: int | None = Field(None, gt=0)


class TokenizerSpec(_Strict):
    """How the service must call `tokenizers`: the saved file carries no padding/truncation settings."""

    file: str = "tokenizer.json"
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    max_length: int = Field(gt=1)
    truncation: bool = True
    padding_side: Literal["right", "left"] = "right"
    pad_token_id: int = Field(ge=0)
    lowercase: bool | None = None


class SpecialTokens(_Strict):
    pad: int | None = None
    cls: int | None = None
    sep: int | None = None
    mask: int | None = None
    unk: int | None = None
    bos: int | None = None
    eos: int | None = None


class GenerationLayout(_Strict):
    """KV-cache layout of a decoder graph (filled in for text-generation).

    The cache tensors are [batch, num_key_value_heads, positions, head_dim]: under grouped-query attention
    (Llama family) several query heads share one key/value head, so the cache has fewer heads than the
    attention. A manifest written before the field existed has as many key/value heads as heads.
    """

    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)  # attention (query) heads
    num_key_value_heads: int = Field(gt=0)  # heads of the cache's keys and values
    head_dim: int = Field(gt=0)
    past_key_name: str = "past_key_values.{layer}.key"
    past_value_name: str = "past_key_values.{layer}.value"
    present_key_name: str = "present.{layer}.key"
    present_value_name: str = "present.{layer}.value"
    eos_token_id: int | None = None  # the tokenizer's eos; kept as it was for older readers
    # Every id generation ends at: a model may have several (generation_config.json's eos_token_id is then a
    # list; Llama-3's chat end-of-turn <|eot_id|> is not its eos). Empty in manifests written before the
    # field: then eos_token_id alone. Read it through stop_ids().
    stop_token_ids: list[int] = Field(default_factory=list)
    pad_token_id: int | None = None
    graphs: Literal["merged", "split"] = "merged"
    # "all": `present` is past + new positions (optimum's graph, which copies the cache into it each call).
    # "new": `present` holds only the positions fed in (distilserve's appending GPT-2 graph).
    # Either way the new positions are the last ones; the runner appends them to the cache it keeps.
    present_positions: Literal["all", "new"] = "all"

    @model_validator(mode="before")
    @classmethod
    def _key_value_heads_default_to_heads(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("num_key_value_heads") is None and "num_heads" in data:
            return {**data, "num_key_value_heads": data["num_heads"]}
        return data

    def stop_ids(self) -> frozenset[int]:
        """The ids that end a sequence: `stop_token_ids` and `eos_token_id` together."""
        eos = () if self.eos_token_id is None else (self.eos_token_id,)
        return frozenset((*self.stop_token_ids, *eos))

    @model_validator(mode="after")
    def _heads_share_key_value_heads_evenly(self) -> GenerationLayout:
        if self.num_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        return self


class ChatTemplateSpec(_Strict):
    """The model's chat template (HF's Jinja source, as `tokenizer.chat_template` holds it) and the special
    tokens it refers to by name, so that the service renders messages as `apply_chat_template` does.

    Kept in the manifest (a few KB of text) rather than in a file beside tokenizer.json: the manifest is the
    only file the service trusts, and the template is part of what the model expects. Generation ends at any
    of `generation.stop_ids()`; export puts `eos_token`'s id among them (the tokenizer's eos token, which for
    chat models is the end-of-turn token the template closes each message with: SmolLM2's `<|im_end|>`).
    """

    template: str = Field(min_length=1)
    bos_token: str | None = None
    eos_token: str | None = None


class EmbeddingSpec(_Strict):
    """What a sentence-embeddings graph gives (export.sentence_embedding): `output` [batch, dimensions],
    pooled as `pooling` says over the real tokens, L2-normalised when `normalized`. `pooled_output`, when the
    graph has it, is the same vector before normalisation (TEI's `normalize: false`)."""

    dimensions: int = Field(gt=0)
    normalized: bool
    pooling: Literal["mean", "cls", "max"]
    output: str = "sentence_embedding"
    pooled_output: str | None = None


class ModelScore(_Strict):
    source: str
    params: int = Field(gt=0)
    score: float | None = None


class DistillationRecord(_Strict):
    """Where the student came from and how close it stays to its teacher."""

    metric: str
    teacher: ModelScore
    student: ModelScore
    agreement: float | None = None
    eval_source: str | None = None
    eval_examples: int | None = None
    # sentence-embeddings: the mean cosine of the student's vectors with its teacher's over the eval
    # sentences, the unit of an embedding student's live agreement (service.tasks.embedding_shadow)
    teacher_cosine: float | None = Field(None, ge=-1.0, le=1.0)

    @property
    def student_ahead(self) -> bool:
        """The student scored better than its teacher on the distillation eval (a short-trained teacher,
        a student taught longer): a cascade's answers from that teacher cost quality, not only time."""
        mine, theirs = self.student.score, self.teacher.score
        if mine is None or theirs is None:
            return False
        lower_is_better = any(word in self.metric.lower() for word in ("perplexity", "loss"))
        return mine < theirs if lower_is_better else mine > theirs


class TeacherRef(_Strict):
    """The model version a student was distilled from, as the same repository serves it."""

    name: str = Field(pattern=MODEL_NAME_PATTERN)
    version: int = Field(gt=0)


class PayingLimit(_Strict):
    """The highest threshold at which the cascade still costs less than the teacher alone, on the
    calibration inputs (common.cascade.paying_limit): the most agreement a cascade that pays reaches."""

    threshold: float = Field(ge=0.0)
    agreement: float = Field(ge=0.0, le=1.0)
    fallback_rate: float = Field(ge=0.0, le=1.0)


class CascadeCalibration(_Strict):
    """How the student hands inputs to its teacher (common.cascade): an input whose confidence (the score of
    the student's best answer) is below `threshold` is answered by the teacher. Measured at export on
    `eval_examples` inputs of `eval_source`: the share sent to the teacher and the resulting agreement with
    the teacher alone, against the student's own. `student_cost`: the student's time over those inputs ÷ the
    teacher's; when it and the fallback rate add up to 1 or more, the cascade costs more than the teacher
    alone at this threshold, and the service answers with the teacher directly (service.cascade).

    A cross-encoder pair (one label: a relevance logit) ranks instead (`confidence` "score-margin",
    common.cascade's ranking cascade): for a query, the teacher reads again the documents whose student logit
    is within `threshold` of the best one's; `agreement` is then the share of queries whose best document is
    the teacher's, and `fallback_rate` the share of documents the teacher reads."""

    # "top-score": the best answer's score (the top label's, the best span's or the top token's
    # probability); "score-margin": a document's distance below the query's best student logit
    confidence: Literal["top-score", "score-margin"] = "top-score"
    threshold: float = Field(ge=0.0)
    target_agreement: float = Field(ge=0.0, le=1.0)
    agreement: float = Field(ge=0.0, le=1.0)
    fallback_rate: float = Field(ge=0.0, le=1.0)
    student_agreement: float = Field(ge=0.0, le=1.0)
    eval_examples: int = Field(gt=0)
    eval_source: str | None = None
    student_cost: float | None = Field(None, gt=0.0)
    paying_limit: PayingLimit | None = None  # None: not timed, or a student as dear as its teacher

    @property
    def costs_more_than_teacher(self) -> bool:
        """Each input costs the student's pass, and the unsure ones the teacher's too."""
        return self.student_cost is not None and self.student_cost + self.fallback_rate >= 1.0


class Manifest(_Strict):
    """Everything the service trusts about one model version."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=MODEL_NAME_PATTERN)
    version: int = Field(gt=0)
    task: Task
    labels: dict[int, str] = Field(default_factory=dict)
    max_sequence_length: int = Field(gt=1)
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    variants: dict[str, VariantSpec] = Field(min_length=1)
    # Variants export built or tried and left out, with why (failed its parity gate, could not be built):
    # an operator asking "why is this model on fp32" reads the answer here and in GET /v1/models.
    rejected_variants: dict[str, str] = Field(default_factory=dict)
    tokenizer: TokenizerSpec
    special_tokens: SpecialTokens = SpecialTokens()
    generation: GenerationLayout | None = None
    chat: ChatTemplateSpec | None = None  # text-generation only; absent: no /v1/chat/completions
    embedding: EmbeddingSpec | None = None  # sentence-embeddings only: width, pooling, normalisation
    distillation: DistillationRecord | None = None
    teacher: TeacherRef | None = None  # a student exported as a pair: the served model it was distilled from
    cascade: CascadeCalibration | None = None  # the pair's cascade threshold, calibrated at export
    opset: int | None = None
    created_at: str | None = None
    git_revision: str | None = None
    source_model: str | None = None

    @property
    def cross_encoder(self) -> bool:
        """A classifier of one label reads a query and a document together and answers their relevance."""
        return self.task == "text-classification" and len(self.labels) == 1

    @model_validator(mode="after")
    def _task_extras_present(self) -> Manifest:
        if self.task == "text-classification" and not self.labels:
            raise ValueError("text-classification needs 'labels' (id -> label)")
        if self.task == "fill-mask" and self.special_tokens.mask is None:
            raise ValueError("fill-mask needs special_tokens.mask")
        if self.task == "text-generation" and self.generation is None:
            raise ValueError("text-generation needs 'generation' (the KV-cache layout)")
        if self.chat is not None and self.task != "text-generation":
            raise ValueError("only text-generation models have a chat template")
        if (self.embedding is not None) != (self.task == "sentence-embeddings"):
            raise ValueError("'embedding' (width, pooling) is for sentence-embeddings, which needs it")
        if self.embedding is not None:
            graph = {o.name for o in self.outputs}
            named = (self.embedding.output, self.embedding.pooled_output)
            missing = [n for n in named if n is not None and n not in graph]
            if missing:
                raise ValueError(f"embedding outputs {missing} are not outputs of the graph")
        if self.cascade is not None and self.teacher is None:
            raise ValueError("a cascade calibration needs the 'teacher' it falls back to")
        if self.cascade is not None and (self.cascade.confidence == "score-margin") != self.cross_encoder:
            raise ValueError("a ranking cascade ('score-margin') is a cross-encoder's (one label), and only")
        if self.teacher is not None and self.teacher.name == self.name:
            raise ValueError("a model cannot be its own teacher")
        if "fp32" not in self.variants:
            raise ValueError(
                "every model needs the 'fp32' variant (the reference the others are checked against)"
            )
        if any(v.drafts_only for v in self.variants.values()) and (
            self.task != "text-generation" or self.teacher is None
        ):
            raise ValueError("only a generation student with a 'teacher' has a variant that drafts only")
        if self.variants["fp32"].drafts_only:
            raise ValueError("the 'fp32' variant answers: it cannot be one that drafts only")
        return self

    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]
