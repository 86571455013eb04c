"""Seeded demo data for every task, so the pipeline runs end to end on a fresh machine.

Everything is drawn from template grammars with `random.Random` instances seeded from `seed`
(never the global RNG), so a seed always gives byte-identical files. The files use the same
formats as the real data sets (JSON lines, SQuAD v1.1, plain text) and load with `loaders`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from training.data.demo_facts import Names, fact_paragraph, qa_articles
from training.data.demo_reviews import classification_splits, make_review
from training.data.grammar import cap, phrases, pick, words
from training.data.loaders import split_examples
from training.data.writers import write_json, write_jsonl, write_lines

# --------------------------------------------------------------------------- file layout


@dataclass(frozen=True)
class DemoFiles:
    """Where `write_demo_data` put each task's train and eval split."""

    root: Path
    classification_train: Path
    classification_eval: Path
    qa_train: Path
    qa_eval: Path
    text_train: Path
    text_eval: Path
    sts_eval: Path  # sentence pairs scored 0-5 (sentence embeddings: Spearman against their cosines)


def write_demo_data(
    out_dir: Path,
    seed: int = 0,
    n_classification: int = 4000,
    n_qa: int = 1500,
    n_text_lines: int = 4000,
    eval_fraction: float = 0.1,
    n_sts: int = 500,
) -> DemoFiles:
    """Write all demo splits under `out_dir`; counts are totals over train plus eval."""
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    root = Path(out_dir)
    files = DemoFiles(
        root=root,
        classification_train=root / "classification" / "train.jsonl",
        classification_eval=root / "classification" / "eval.jsonl",
        qa_train=root / "qa" / "train.json",
        qa_eval=root / "qa" / "eval.json",
        text_train=root / "text" / "train.txt",
        text_eval=root / "text" / "eval.txt",
        sts_eval=root / "sts" / "eval.jsonl",
    )
    train, evals = classification_splits(_rng(seed, "classification"), n_classification, eval_fraction, seed)
    write_jsonl(files.classification_train, train)
    write_jsonl(files.classification_eval, evals)
    articles = qa_articles(_rng(seed, "qa"), n_qa)
    qa_train, qa_eval = split_examples(articles, eval_fraction, seed)
    write_json(files.qa_train, {"version": "1.1", "data": qa_train})
    write_json(files.qa_eval, {"version": "1.1", "data": qa_eval})
    text_train, text_eval = split_examples(_text_lines(_rng(seed, "text"), n_text_lines), eval_fraction, seed)
    write_lines(files.text_train, text_train)
    write_lines(files.text_eval, text_eval)
    write_jsonl(files.sts_eval, sts_pairs(_rng(seed, "sts"), n_sts))
    return files


def _rng(seed: int, stream: str) -> random.Random:
    """One independent stream per task, so changing one task's size leaves the others unchanged."""
    return random.Random(f"distilserve-demo:{seed}:{stream}")


# --------------------------------------------------------------------------- plain sentences

_ANIMALS = words("dog cat horse bird fox rabbit cow goat")
_PEOPLE = words("teacher farmer child doctor neighbor baker student driver")
_PLACES = words("river market station school park library garden harbor village cinema")
_MOTIONS = words("walked ran drove went hurried wandered cycled")
_WHEN = phrases(
    "in the morning | at noon | in the evening | at night | on Sunday | after lunch | every day |"
    " for a minute | every minute"
)
_ERRANDS = phrases(
    "read a book | wrote a letter | watched a film | found a map | carried a basket of apples | "
    "made a cup of tea | bought a newspaper | sang a song | painted a picture | fixed a bicycle"
)
_MODIFIERS = words("tired happy young old quiet busy clever small")
_ANIMAL_MOTIONS = words("walked ran went hurried wandered")


def _simple_sentence(rng: random.Random) -> str:
    """Short declarative sentences, so the LM text is not only reviews and biographies."""
    modifier = pick(rng, _MODIFIERS) + " " if rng.random() < 0.5 else ""
    person = rng.random() < 0.6
    who = f"the {modifier}{pick(rng, _PEOPLE if person else _ANIMALS)}"
    moved = pick(rng, _MOTIONS if person else _ANIMAL_MOTIONS)
    place = f"the {pick(rng, _PLACES)}"
    shape = rng.randrange(5)
    if shape == 0:
        text = f"{who} {moved} to {place} {pick(rng, _WHEN)}"
    elif shape == 1 and person:
        text = f"{who} {pick(rng, _ERRANDS)} at {place}"
    elif shape == 2:
        weather = pick(rng, ("cold", "warm", "quiet", "late", "early"))
        text = f"it was {weather} when {who} reached {place}"
    elif shape == 3:
        text = f"every {pick(rng, ('morning', 'evening', 'week'))}, {who} {moved} to {place}"
    elif person:
        text = f"{who} {pick(rng, _ERRANDS)} and then {moved} home"
    else:
        text = f"{who} {moved} past {place} and then lay down"
    return cap(text) + "."


def _text_lines(rng: random.Random, n: int) -> list[str]:
    """Lines mixing reviews, fact paragraphs and simple sentences, in the proportions MLM/CLM need."""
    names = Names(rng)
    lines: list[str] = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.4:
            count = rng.randint(1, 3)
            lines.append(" ".join(make_review(rng, rng.random() < 0.5) for _ in range(count)))
        elif kind < 0.7:
            lines.append(fact_paragraph(rng, names))
        else:
            lines.append(" ".join(_simple_sentence(rng) for _ in range(rng.randint(2, 4))))
    return lines


# --------------------------------------------------------------------------- scored sentence pairs

_STS_SLOTS = (_PEOPLE, _MOTIONS, _PLACES, _WHEN)


def sts_pairs(rng: random.Random, n: int) -> list[dict[str, object]]:
    """STS-style pairs: "The {who} {moved} to the {place} {when}." twice, each of the four slots kept or
    drawn again, scored 5 x the share of the slots whose value both sentences share (0-5, as STS-B)."""

    def sentence(values: list[str]) -> str:
        who, moved, place, when = values
        return cap(f"the {who} {moved} to the {place} {when}") + "."

    rows: list[dict[str, object]] = []
    for _ in range(n):
        first = [pick(rng, slot) for slot in _STS_SLOTS]
        kept = set(rng.sample(range(len(_STS_SLOTS)), rng.randint(0, len(_STS_SLOTS))))
        second = [first[i] if i in kept else pick(rng, slot) for i, slot in enumerate(_STS_SLOTS)]
        score = 5 * sum(a == b for a, b in zip(first, second, strict=True)) / len(_STS_SLOTS)
        rows.append({"sentence1": sentence(first), "sentence2": sentence(second), "score": score})
    return rows
