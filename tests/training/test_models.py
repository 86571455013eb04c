"""Students cut from teachers (BERT classifiers, BERT MLMs, GPT-2 LMs) hold exactly the chosen teacher
weights; narrower students build from config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedModel,
)

from training.models import (
    PRESETS,
    count_parameters,
    default_layer_map,
    load_teacher,
    load_trained,
    make_student,
    preset_family,
    set_dropout,
)

LABELS = ["negative", "positive"]


def _teacher(layers: int = 4) -> PreTrainedModel:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
        id2label=dict(enumerate(LABELS)),
        label2id={name: i for i, name in enumerate(LABELS)},
    )
    return BertForSequenceClassification(config)


def _same(a: torch.nn.Module, b: torch.nn.Module, a_name: str = "", b_name: str | None = None) -> bool:
    """Equal weights in submodule `a_name` of a and `b_name` (default: the same name) of b."""
    sa = a.get_submodule(a_name).state_dict()
    sb = b.get_submodule(a_name if b_name is None else b_name).state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_default_layer_map_spreads_over_depth() -> None:
    assert default_layer_map(12, 6) == [0, 2, 4, 7, 9, 11]  # DistilBERT
    assert default_layer_map(4, 2) == [0, 3]
    assert default_layer_map(4, 1) == [0]
    assert default_layer_map(3, 3) == [0, 1, 2]
    with pytest.raises(ValueError):
        default_layer_map(2, 3)


def test_student_holds_the_chosen_teacher_weights() -> None:
    teacher = _teacher(layers=4)
    student = make_student(teacher, num_layers=2, layer_map=[1, 3])

    assert student.config.num_hidden_layers == 2
    assert student.config.id2label == teacher.config.id2label
    assert _same(student, teacher, "bert.embeddings")
    assert _same(student, teacher, "bert.encoder.layer.0", "bert.encoder.layer.1")
    assert _same(student, teacher, "bert.encoder.layer.1", "bert.encoder.layer.3")
    assert _same(student, teacher, "bert.pooler")
    assert _same(student, teacher, "classifier")
    assert count_parameters(student) < count_parameters(teacher)
    # Copies, not shared tensors: training the student must not move the teacher.
    assert (
        student.get_parameter("classifier.weight").data_ptr()
        != teacher.get_parameter("classifier.weight").data_ptr()
    )


def test_default_student_takes_first_and_last_layers() -> None:
    teacher = _teacher(layers=4)
    student = make_student(teacher, num_layers=2)
    assert _same(student, teacher, "bert.encoder.layer.0", "bert.encoder.layer.0")
    assert _same(student, teacher, "bert.encoder.layer.1", "bert.encoder.layer.3")


def test_full_depth_student_predicts_like_the_teacher() -> None:
    teacher = _teacher(layers=2).eval()
    student = make_student(teacher, num_layers=2).eval()
    ids = torch.randint(5, 50, (3, 7))
    torch.testing.assert_close(student(input_ids=ids).logits, teacher(input_ids=ids).logits)


def test_narrower_student_builds_from_config() -> None:
    teacher = _teacher(layers=4)
    student = make_student(teacher, num_layers=2, hidden_size=16)
    assert student.config.hidden_size == 16
    assert student.config.num_attention_heads == 1  # the teacher's head size (16) is kept
    assert student.config.intermediate_size == 32  # the feed-forward keeps its 2x ratio
    assert student.config.label2id == teacher.config.label2id
    logits = student(input_ids=torch.randint(5, 50, (2, 5))).logits
    assert logits.shape == (2, 2)
    assert count_parameters(student) < count_parameters(teacher)


def test_bad_students_are_rejected() -> None:
    teacher = _teacher(layers=4)
    with pytest.raises(ValueError, match="layer_map"):
        make_student(teacher, num_layers=2, layer_map=[0, 4])
    with pytest.raises(ValueError, match="layer_map"):
        make_student(teacher, num_layers=2, layer_map=[0])
    with pytest.raises(ValueError, match="layer_map needs"):
        make_student(teacher, num_layers=2, layer_map=[0, 3], hidden_size=16)
    with pytest.raises(ValueError, match="multiple"):
        make_student(teacher, num_layers=2, hidden_size=20)


def test_preset_teacher_carries_labels_and_vocabulary() -> None:
    model = load_teacher("bert-tiny", "text-classification", LABELS, tokenizer_vocab_size=123)
    assert model.config.vocab_size == 123
    assert model.config.num_hidden_layers == PRESETS["bert-tiny"]["num_hidden_layers"]
    assert model.config.id2label == {0: "negative", 1: "positive"}
    with pytest.raises(ValueError, match="tokenizer_vocab_size"):
        load_teacher("bert-tiny", "text-classification", LABELS)
    with pytest.raises(ValueError, match="unknown task"):
        load_teacher("bert-tiny", "summarization", LABELS, tokenizer_vocab_size=10)


def test_local_checkpoint_keeps_a_matching_head_and_replaces_another(tmp_path: Path) -> None:
    teacher = _teacher(layers=2)
    teacher.save_pretrained(tmp_path)

    same = load_teacher(str(tmp_path), "text-classification", ["Positive", "NEGATIVE"])
    assert _same(same, teacher, "classifier")
    assert same.config.label2id == teacher.config.label2id

    other = load_teacher(str(tmp_path), "text-classification", ["a", "b", "c"])
    assert other.config.id2label == {0: "a", 1: "b", 2: "c"}
    assert other.get_parameter("classifier.weight").shape[0] == 3
    assert _same(load_trained(str(tmp_path), "text-classification"), teacher)


# --------------------------------------------------------------------------- language-model students


def _mlm_teacher(layers: int = 4) -> PreTrainedModel:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    return BertForMaskedLM(config)


def _gpt2_teacher(layers: int = 4) -> PreTrainedModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=50, n_layer=layers, n_embd=32, n_head=2, n_positions=32))


def test_mlm_student_holds_the_chosen_layers_and_the_tied_mlm_head() -> None:
    teacher = _mlm_teacher(layers=4)
    student = make_student(teacher, num_layers=2, layer_map=[1, 3])

    assert isinstance(student, BertForMaskedLM) and student.config.num_hidden_layers == 2
    assert _same(student, teacher, "bert.embeddings")
    assert _same(student, teacher, "bert.encoder.layer.0", "bert.encoder.layer.1")
    assert _same(student, teacher, "bert.encoder.layer.1", "bert.encoder.layer.3")
    assert _same(student, teacher, "cls.predictions")  # transform, bias and the decoder
    decoder = student.get_output_embeddings()
    assert decoder.weight is student.get_input_embeddings().weight  # still tied, to the student's own
    assert decoder.weight.data_ptr() != teacher.get_output_embeddings().weight.data_ptr()


def test_gpt2_student_holds_the_chosen_blocks_and_the_tied_lm_head() -> None:
    teacher = _gpt2_teacher(layers=4)
    student = make_student(teacher, num_layers=2, layer_map=[0, 2])

    assert isinstance(student, GPT2LMHeadModel) and student.config.n_layer == 2
    for name in ("transformer.wte", "transformer.wpe", "transformer.ln_f", "lm_head"):
        assert _same(student, teacher, name), name
    assert _same(student, teacher, "transformer.h.0", "transformer.h.0")
    assert _same(student, teacher, "transformer.h.1", "transformer.h.2")
    assert student.lm_head.weight is student.transformer.wte.weight
    assert student.lm_head.weight.data_ptr() != teacher.lm_head.weight.data_ptr()
    assert make_student(teacher, num_layers=3).config.n_layer == 3  # default map 0, 2, 3


def test_full_depth_language_model_students_predict_like_their_teachers() -> None:
    ids = torch.randint(0, 50, (2, 9))
    for teacher in (_mlm_teacher(layers=2).eval(), _gpt2_teacher(layers=2).eval()):
        student = make_student(teacher, num_layers=2).eval()
        torch.testing.assert_close(student(input_ids=ids).logits, teacher(input_ids=ids).logits)


def test_narrower_gpt2_student_builds_from_config() -> None:
    student = make_student(_gpt2_teacher(layers=4), num_layers=2, hidden_size=16)
    assert (student.config.n_embd, student.config.n_head, student.config.n_layer) == (16, 1, 2)
    assert student(input_ids=torch.randint(0, 50, (1, 5))).logits.shape == (1, 5, 50)


def test_gpt2_preset_teacher_takes_the_tokenizer_special_ids() -> None:
    ids = {"pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
    model = load_teacher("gpt2-tiny", "text-generation", tokenizer_vocab_size=300, token_ids=ids)
    assert isinstance(model, GPT2LMHeadModel)
    assert (model.config.n_layer, model.config.n_embd, model.config.n_positions) == (2, 64, 64)
    assert (model.config.eos_token_id, model.config.pad_token_id, model.config.vocab_size) == (0, 0, 300)
    assert preset_family("gpt2-demo") == "gpt2" and preset_family("bert-demo") == "bert"
    mlm = load_teacher("bert-tiny", "fill-mask", tokenizer_vocab_size=100)
    assert isinstance(mlm, BertForMaskedLM) and mlm.config.vocab_size == 100


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_dropout_off_makes_training_mode_deterministic_and_is_saved(family: str, tmp_path: Path) -> None:
    if family == "bert":
        model = _teacher(layers=2)
        assert model.config._attn_implementation == "sdpa"  # its attention keeps the rate as a float
    else:
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=32))
    ids = torch.randint(5, 50, (2, 12))
    model.train()
    assert not torch.equal(model(ids).logits, model(ids).logits)  # dropout draws differ call to call
    set_dropout(model, 0.0)
    assert torch.equal(model(ids).logits, model(ids).logits)
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).train()  # a student cut from it has none either
    assert torch.equal(reloaded(ids).logits, reloaded(ids).logits)


def test_a_teacher_trained_for_another_task_is_refused(tiny_models: dict[str, Path]) -> None:
    """Its head would load as random weights with only a warning: distilling noise, silently."""
    with pytest.raises(ValueError, match=r"holds a BertForSequenceClassification, not a fill-mask model"):
        load_trained(str(tiny_models["text-classification"]), "fill-mask")
    mlm = load_trained(str(tiny_models["fill-mask"]), "fill-mask")
    assert mlm.config.architectures == ["BertForMaskedLM"]
