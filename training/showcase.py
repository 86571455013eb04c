"""A saved model's answer to one canonical input per task: the demo's smoke test that a person can read.

Scores say how well a model does on average; these say whether it does something sensible at all
(a review's label, the year a city was founded, a noun for "I loved this [MASK]", a fluent continuation of
"The film was").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from training import qa
from training.data.types import QAExample
from training.models import load_trained


@torch.inference_mode()
def classify(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, text: str) -> str:
    probs = model(**tokenizer(text, return_tensors="pt")).logits[0].softmax(-1)
    best = int(probs.argmax())
    return f"{(model.config.id2label or {}).get(best, best)} ({float(probs[best]):.2f})"


@torch.inference_mode()
def fill_mask(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, text: str, top_k: int = 5) -> str:
    """The top-k tokens for the (first) mask, best first; `[MASK]` stands for the tokenizer's mask token."""
    inputs = tokenizer(text.replace("[MASK]", str(tokenizer.mask_token)), return_tensors="pt")
    position = int((inputs["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0])
    top = model(**inputs).logits[0, position].topk(top_k).indices
    return ", ".join(tokenizer.convert_ids_to_tokens(top.tolist()))


@torch.inference_mode()
def continue_text(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: str, max_new_tokens: int = 20
) -> str:
    """Greedy continuation, up to the end of the text."""
    inputs = tokenizer(prompt, return_tensors="pt")
    eos = tokenizer.eos_token_id
    output = model.generate(  # type: ignore[operator]
        **inputs, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos
    )
    return str(tokenizer.decode(output[0], skip_special_tokens=True))


# Extractive QA reads a question and a context; the canonical input joins them with this separator.
QA_SEPARATOR = " | "


def answer_question(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, text: str) -> str:
    """The best span of the context for `question | context`, found as the evaluation finds it."""
    question, context = text.split(QA_SEPARATOR, 1)
    data = qa.QAData([QAExample(id="showcase", title="showcase", question=question, context=context)], "")
    max_length = min(qa.MAX_LENGTH, int(model.config.max_position_embeddings))
    span = qa.predict_spans(model, data, tokenizer, max_length=max_length)[0]
    return repr(qa.answer_text(context, span))


Answer = Callable[[PreTrainedModel, PreTrainedTokenizerBase, str], str]
# Per task: the canonical input, and how a model answers it.
CANONICAL: dict[str, tuple[str, Answer]] = {
    "text-classification": ("I loved this film, it was wonderful", classify),
    "question-answering": (
        "When was the city founded?"
        + QA_SEPARATOR
        + "Norbridge is a city on the Avel River. The city was founded in 1802 and has about 41,000 people.",
        answer_question,
    ),
    "fill-mask": ("I loved this [MASK], it was wonderful.", fill_mask),
    "text-generation": ("The film was", continue_text),
}


def showcase(task: str, model_dir: str | Path) -> str:
    """`input -> answer` for the task's canonical input, from a saved model directory."""
    if task not in CANONICAL:
        return "(no canonical input for this task)"
    model = load_trained(str(model_dir), task).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    text, answer = CANONICAL[task]
    return f"{text!r} -> {answer(model, tokenizer, text)}"
