"""Teachers (a preset trained from scratch, a local HF directory or a hub id) and students cut from them.

A student keeps the teacher's width where it can and then starts from the teacher's own weights
(DistilBERT): embeddings, a chosen subset of the transformer layers, pooler and task head (for BERT's MLM
head and GPT-2's LM head that includes the output projection tied to the word embeddings). A narrower
student has no shapes to copy and starts from its config.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch.nn as nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    BertConfig,
    GPT2Config,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.models.auto.auto_factory import _BaseAutoModelClass

# Small shapes for teachers trained from scratch (there is no hub on the build machines). A preset is named
# <family>-<size>; the family picks the config class and the tokenizer a from-scratch run trains.
PRESETS: dict[str, dict[str, int | str]] = {
    # ~4M parameters: learns the demo data in well under a minute on 2 CPU cores.
    "bert-demo": {
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "max_position_embeddings": 128,
    },
    # For tests that must run in seconds.
    "bert-tiny": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 64,
    },
    # Masked-LM pretraining from scratch: with absolute positions a small BERT on a CPU budget stays in
    # its bag-of-words phase (measured: no noun in the top-5 for "I loved this [MASK]" after 800 steps);
    # relative position scores (Huang et al., 2020) let it learn word order within ~500 steps.
    "bert-mlm": {
        "num_hidden_layers": 4,
        "hidden_size": 128,
        "num_attention_heads": 2,
        "intermediate_size": 512,
        "max_position_embeddings": 128,
        "position_embedding_type": "relative_key_query",
    },
    # GPT-2 shapes (its own field names); the feed-forward is 4 x n_embd.
    "gpt2-demo": {"n_layer": 4, "n_embd": 256, "n_head": 4, "n_positions": 128},
    "gpt2-tiny": {"n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 64},
}
FAMILY_CONFIGS: dict[str, type[PretrainedConfig]] = {"bert": BertConfig, "gpt2": GPT2Config}

# The HF auto class each task's models load with.
TASK_MODEL_CLASSES: dict[str, type[_BaseAutoModelClass]] = {
    "text-classification": AutoModelForSequenceClassification,
    "question-answering": AutoModelForQuestionAnswering,
    "fill-mask": AutoModelForMaskedLM,
    "text-generation": AutoModelForCausalLM,
}


def preset_family(name: str) -> str:
    """The family of a preset, "bert" or "gpt2": its config class and the tokenizer it trains."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}")
    return name.split("-", 1)[0]


def preset_config(
    name: str,
    vocab_size: int,
    token_ids: Mapping[str, int] | None = None,
    label_names: Sequence[str] = (),
) -> PretrainedConfig:
    """The preset's config for a vocabulary of `vocab_size` with the tokenizer's special token ids."""
    config_class = FAMILY_CONFIGS[preset_family(name)]
    ids = dict(token_ids) if token_ids is not None else {"pad_token_id": 0}
    labels = _labels(label_names) if label_names else {}
    attention = _attention(PRESETS[name].get("position_embedding_type"))
    kwargs: dict[str, Any] = {"vocab_size": vocab_size, **PRESETS[name], **ids, **labels, **attention}
    return config_class(**kwargs)


def _attention(position_embedding_type: object) -> dict[str, str]:
    """Eager attention for relative positions: BERT's SDPA path cannot score them and would fall back to
    eager anyway, with a warning at every load."""
    relative = position_embedding_type not in (None, "absolute")
    return {"attn_implementation": "eager"} if relative else {}


def _attention_of(config: PretrainedConfig) -> dict[str, str]:
    return _attention(getattr(config, "position_embedding_type", None))


def _model_class(task: str) -> type[_BaseAutoModelClass]:
    if task not in TASK_MODEL_CLASSES:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(TASK_MODEL_CLASSES)}")
    return TASK_MODEL_CLASSES[task]


def _labels(label_names: Sequence[str]) -> dict[str, object]:
    return {
        "num_labels": len(label_names),
        "id2label": dict(enumerate(label_names)),
        "label2id": {name: i for i, name in enumerate(label_names)},
    }


def _head_matches(config: object, label_names: Sequence[str]) -> bool:
    """True when a checkpoint's head already predicts exactly these labels (in any order, any case)."""
    known = {str(name).lower() for name in getattr(config, "label2id", {}) or {}}
    return len(known) == len(label_names) and known == {name.lower() for name in label_names}


def load_teacher(
    source: str,
    task: str,
    label_names: Sequence[str] = (),
    tokenizer_vocab_size: int | None = None,
    token_ids: Mapping[str, int] | None = None,
) -> PreTrainedModel:
    """A teacher from a preset name (fresh weights), a local HF directory or a hub id.

    `label_names` are for tasks with a label head (classification), empty for the others. A checkpoint
    whose head already predicts these labels is kept as it is (its label ids may be in another order:
    callers map label names through `model.config.label2id`). Otherwise a new head with our labels
    replaces it. A preset needs the vocabulary size and special token ids of its freshly trained tokenizer.
    """
    model_class = _model_class(task)
    if source in PRESETS:
        if tokenizer_vocab_size is None:
            raise ValueError(f"preset {source!r} is trained from scratch: pass tokenizer_vocab_size")
        return model_class.from_config(preset_config(source, tokenizer_vocab_size, token_ids, label_names))
    config = AutoConfig.from_pretrained(source)
    if not label_names or _head_matches(config, label_names):
        return model_class.from_pretrained(source, **_attention_of(config))
    return model_class.from_pretrained(
        source, ignore_mismatched_sizes=True, **_labels(label_names), **_attention_of(config)
    )


def load_trained(source: str, task: str) -> PreTrainedModel:
    """A model already trained for `task` (a teacher to distil from), head and labels as saved."""
    config = AutoConfig.from_pretrained(source)
    check_trained_for(config, task, source)
    return _model_class(task).from_pretrained(source, **_attention_of(config))


# How the architecture names of models trained for each task end (BertForMaskedLM, GPT2LMHeadModel, ...).
TASK_HEADS: dict[str, tuple[str, ...]] = {
    "text-classification": ("ForSequenceClassification",),
    "question-answering": ("ForQuestionAnswering",),
    "fill-mask": ("ForMaskedLM", "ForPreTraining"),
    "text-generation": ("ForCausalLM", "LMHeadModel"),
}


def check_trained_for(config: PretrainedConfig, task: str, source: object) -> None:
    """A model said to be trained for `task` must carry that task's head: another one would be replaced
    by random weights without a word (transformers only warns)."""
    architectures = getattr(config, "architectures", None) or []
    heads = TASK_HEADS.get(task)  # an unknown task is refused where the model class is chosen
    if heads and architectures and not any(a.endswith(heads) for a in architectures):
        raise ValueError(
            f"{source} holds a {architectures[0]}, not a {task} model: its {task} head would be random "
            "weights (give the --task it was trained for)"
        )


def default_layer_map(teacher_layers: int, student_layers: int) -> list[int]:
    """Teacher layers spread evenly over the depth, first and last included.

    12 -> 6: 0,2,4,7,9,11 (DistilBERT's choice); 4 -> 2: 0,3; 4 -> 3: 0,2,3 (rounding half to even).

    A one-layer student takes layer 0: it is the only one trained on the embeddings' output as its input.
    """
    if not 1 <= student_layers <= teacher_layers:
        raise ValueError(f"a student needs 1..{teacher_layers} layers, got {student_layers}")
    if student_layers == 1:
        return [0]
    step = (teacher_layers - 1) / (student_layers - 1)
    return [round(i * step) for i in range(student_layers)]


def layer_stack(model: nn.Module, num_layers: int) -> tuple[str, nn.ModuleList]:
    """The transformer layers' ModuleList and its dotted name (bert.encoder.layer, transformer.h, ...)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == num_layers:
            return name, module
    raise ValueError(f"no list of {num_layers} layers in {type(model).__name__}")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def make_student(
    teacher: PreTrainedModel,
    num_layers: int,
    layer_map: list[int] | None = None,
    hidden_size: int | None = None,
) -> PreTrainedModel:
    """A shallower (optionally narrower) copy of the teacher's architecture, with the teacher's labels.

    Same width: every weight outside the layer stack is copied, and student layer i is teacher layer
    layer_map[i] (default: `default_layer_map`). Narrower: built from config, heads keep the teacher's head
    size and the feed-forward keeps its ratio; `layer_map` must then be None.
    """
    config = copy.deepcopy(teacher.config)
    teacher_layers = int(config.num_hidden_layers)
    config.num_hidden_layers = num_layers
    model_class = type(teacher)

    if hidden_size is not None and hidden_size != config.hidden_size:
        if layer_map is not None:
            raise ValueError("layer_map needs a student as wide as the teacher; drop it or hidden_size")
        head_dim = config.hidden_size // config.num_attention_heads
        if hidden_size % head_dim:
            raise ValueError(
                f"hidden_size {hidden_size} must be a multiple of the teacher's head size {head_dim}"
            )
        for field in ("intermediate_size", "n_inner"):  # BERT's and GPT-2's (None there: 4 x width)
            if getattr(config, field, None) is not None:
                setattr(config, field, getattr(config, field) * hidden_size // config.hidden_size)
        config.num_attention_heads = hidden_size // head_dim
        config.hidden_size = hidden_size
        return model_class(config)

    layer_map = default_layer_map(teacher_layers, num_layers) if layer_map is None else list(layer_map)
    if len(layer_map) != num_layers or not all(0 <= i < teacher_layers for i in layer_map):
        raise ValueError(
            f"layer_map {layer_map} must name {num_layers} teacher layers in 0..{teacher_layers - 1}"
        )

    student = model_class(config)
    stack_name, teacher_stack = layer_stack(teacher, teacher_layers)
    student_stack = student.get_submodule(stack_name)
    assert isinstance(student_stack, nn.ModuleList)
    outside = {k: v for k, v in teacher.state_dict().items() if not k.startswith(stack_name + ".")}
    missing, unexpected = student.load_state_dict(outside, strict=False)
    not_copied = [k for k in missing if not k.startswith(stack_name + ".")]
    if not_copied or unexpected:
        raise ValueError(f"student and teacher differ outside the layers: {not_copied or unexpected}")
    for student_index, teacher_index in enumerate(layer_map):
        student_stack[student_index].load_state_dict(teacher_stack[teacher_index].state_dict())
    return student


# Config fields that hold a dropout probability (BERT's and GPT-2's names); None means "use another".
_DROPOUT_FIELDS = (
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "classifier_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
)


def set_dropout(model: nn.Module, probability: float) -> None:
    """Every dropout in the model at `probability`, and its config saying so (students cut from it follow).

    Dropout layers take their rate at construction, so the config alone would change nothing until a
    reload; BERT's SDPA attention keeps its rate as a float attribute rather than a Dropout module.
    """
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = probability
        if isinstance(getattr(module, "dropout_prob", None), float):
            module.dropout_prob = probability  # type: ignore[assignment]
    config = getattr(model, "config", None)
    for field in _DROPOUT_FIELDS:
        if getattr(config, field, None) is not None:
            setattr(config, field, probability)
