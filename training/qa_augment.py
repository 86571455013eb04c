"""Teacher-labelled augmentation for extractive QA: more inputs on which the student learns to imitate its
teacher, when the labelled questions are few (5 k in SQuAD part A's train split).

Every training question is also asked of up to `per_question` other paragraphs of its article, and the
teacher's best span there becomes the answer. The student then learns the teacher's start and end
distributions (the KD term) on contexts it would otherwise never see with that question, and the hard
term points at the teacher's choice, not at a gold answer (TinyBERT augments with word swaps to the same
end). The original examples are kept as they are. The output is a SQuAD v1.1 file `distill --train` reads.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from common.spans import answer_text
from training import qa
from training.data.loaders import squad_document
from training.data.types import Answer, QAExample

AUGMENTED_ID = "{id}/aug{n}"  # an augmented example's id: its question's id and which pairing it is


def article_pairings(examples: Sequence[QAExample], per_question: int, seed: int = 0) -> list[QAExample]:
    """Each question with up to `per_question` other paragraphs of its own article (chosen with `seed`);
    the answers are left empty for the teacher to fill in."""
    paragraphs: dict[str, list[str]] = defaultdict(list)
    for example in examples:
        if example.context not in paragraphs[example.title]:
            paragraphs[example.title].append(example.context)
    rng = random.Random(seed)
    paired = []
    for example in examples:
        others = [c for c in paragraphs[example.title] if c != example.context]
        chosen = rng.sample(others, min(per_question, len(others)))
        paired += [
            replace(example, id=AUGMENTED_ID.format(id=example.id, n=n), context=context, answers=[])
            for n, context in enumerate(chosen)
        ]
    return paired


def teacher_labelled(
    teacher: PreTrainedModel,
    examples: list[QAExample],
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int,
    batch_size: int = 64,
    on_batch: qa.Progress | None = None,
) -> list[QAExample]:
    """The examples answered by the teacher's best span (an example it finds no span in is dropped)."""
    data = qa.QAData(examples, "augmented")
    spans = qa.predict_spans(
        teacher, data, tokenizer, max_length=max_length, batch_size=batch_size, on_batch=on_batch
    )
    answered = []
    for example, span in zip(examples, spans, strict=True):
        text = answer_text(example.context, span)
        if span is not None and text.strip():
            answered.append(replace(example, answers=[Answer(text=text, start=span.start_char)]))
    return answered


def augment(
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_path: str | Path,
    out_path: str | Path,
    *,
    per_question: int,
    max_length: int,
    seed: int = 0,
    on_batch: qa.Progress | None = None,
) -> dict[str, int]:
    """Write the train file's examples plus their teacher-labelled pairings to `out_path`; the counts.
    `on_batch(done, total)` as the teacher answers, in windows."""
    examples = qa.load_data(train_path).examples
    pairings = article_pairings(examples, per_question, seed)
    answered = teacher_labelled(teacher, pairings, tokenizer, max_length=max_length, on_batch=on_batch)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    document = squad_document([*examples, *answered])
    Path(out_path).write_text(json.dumps(document, ensure_ascii=False) + "\n", encoding="utf-8")
    return {"original": len(examples), "augmented": len(answered)}
