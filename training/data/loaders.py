"""Loaders that read the demo files and the standard public formats through one code path.

Classification: JSON lines (`text` + `label`) or a TSV/CSV with a header row (SST-2 style).
Question answering: SQuAD v1.1 JSON. Language modelling: plain text, one paragraph per line
(WikiText-2 raw style, whose ` = Title = ` heading lines can be dropped).
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO, TypeVar

from training.data.types import Answer, ClassificationData, ClassificationExample, QAExample, TextData

T = TypeVar("T")

TEXT_COLUMNS = ("sentence", "text", "sentence1")
PAIR_COLUMNS = ("text_pair", "sentence2")  # a second text read with the first, in every row or none
LABEL_COLUMN = "label"
BINARY_LABEL_NAMES = ["negative", "positive"]

_INT_LABEL = re.compile(r"^-?\d+$")
# WikiText headings: "= Title =", "= = Section = =", ... with the same number of "=" on both sides
# (the lookarounds stop "= a = =" from counting as balanced).
_HEADING = re.compile(r"^(=(?: =)*) (?!= )(.+?)(?<! =) \1$")


# --------------------------------------------------------------------------- classification


def load_classification(path: Path | str) -> ClassificationData:
    """Read `.jsonl` or `.tsv`/`.csv` sentence-label files into label ids plus their names."""
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix == ".jsonl":
        rows = _read_jsonl_rows(file)
    elif suffix in (".tsv", ".csv"):
        rows = _read_table_rows(file, delimiter="\t" if suffix == ".tsv" else ",")
    else:
        raise ValueError(
            f"{file}: unsupported classification file suffix {suffix!r} (use .jsonl, .tsv or .csv"
            + (
                "; a .json file is SQuAD-style QA: pass --task question-answering)"
                if suffix == ".json"
                else ")"
            )
        )
    if not rows:
        raise ValueError(f"{file}: no examples found")
    single = next((r for r in rows if r[3] is None), None)
    if single is not None and any(r[3] is not None for r in rows):
        raise ValueError(f"{file}:{single[0]}: no second text, where other rows have one: every row or none")
    examples, names = _encode_labels(file, rows)
    return ClassificationData(examples=examples, label_names=names, source=str(path))


@contextmanager
def _reading(file: Path, newline: str | None = None) -> Iterator[TextIO]:
    """The file as UTF-8 text, a leading byte-order mark (as Excel writes one) dropped; bytes that are not
    UTF-8 are an error naming the file."""
    try:
        with file.open(encoding="utf-8-sig", newline=newline) as handle:
            yield handle
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{file}: not UTF-8 text (byte {err.start}: {err.reason}); save it as UTF-8"
        ) from None


# (line number, text, raw label, the second text of a pair) before labels are mapped to ids.
_Row = tuple[int, str, int | str, str | None]


def _read_jsonl_rows(file: Path) -> list[_Row]:
    """One JSON object per line; blank lines are allowed so hand-edited files still load."""
    rows: list[_Row] = []
    with _reading(file) as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{file}:{lineno}: invalid JSON: {err.msg}") from err
            if not isinstance(obj, dict):
                raise ValueError(f"{file}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            text, label, pair = obj.get("text"), obj.get("label"), obj.get("text_pair")
            if not isinstance(text, str):
                raise ValueError(f"{file}:{lineno}: 'text' must be a string")
            if pair is not None and not isinstance(pair, str):
                raise ValueError(f"{file}:{lineno}: 'text_pair' must be a string")
            # bool is an int subclass; a true/false label is almost certainly a mistake.
            if isinstance(label, bool) or not isinstance(label, (str, int)):
                raise ValueError(f"{file}:{lineno}: 'label' must be a string or an integer")
            rows.append((lineno, text.strip(), label, None if pair is None else pair.strip()))
    return rows


def _read_table_rows(file: Path, delimiter: str) -> list[_Row]:
    """Header row first; the text column is `sentence` or `text`, the label column `label`."""
    rows: list[_Row] = []
    # GLUE TSVs are unquoted and contain stray quote characters, so TSV is read without quoting.
    with _reading(file, newline="") as handle:
        if delimiter == "\t":
            reader = csv.reader(handle, delimiter=delimiter, quoting=csv.QUOTE_NONE)
        else:
            reader = csv.reader(handle, delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{file}: empty file, expected a header row")
        columns = [name.strip().lower() for name in header]
        text_col = next((columns.index(c) for c in TEXT_COLUMNS if c in columns), None)
        if text_col is None or LABEL_COLUMN not in columns:
            raise ValueError(
                f"{file}:1: header must name a text column ({' or '.join(TEXT_COLUMNS)}) "
                f"and a {LABEL_COLUMN!r} column, got {header}"
            )
        label_col = columns.index(LABEL_COLUMN)
        pair_col = next((columns.index(c) for c in PAIR_COLUMNS if c in columns), None)
        for record in reader:
            lineno = reader.line_num
            if not record or not any(field.strip() for field in record):
                continue
            if len(record) != len(columns):
                raise ValueError(f"{file}:{lineno}: expected {len(columns)} fields, got {len(record)}")
            raw = record[label_col].strip()
            if not raw:
                raise ValueError(f"{file}:{lineno}: empty label")
            label: int | str = int(raw) if _INT_LABEL.match(raw) else raw
            pair = None if pair_col is None else record[pair_col].strip()
            rows.append((lineno, record[text_col].strip(), label, pair))
    return rows


def _encode_labels(file: Path, rows: list[_Row]) -> tuple[list[ClassificationExample], list[str]]:
    """Map raw labels to ids: names sort for string labels, ids stay as given for integer labels."""
    int_rows = [r for r in rows if isinstance(r[2], int)]
    if int_rows and len(int_rows) != len(rows):
        first_str = next(r for r in rows if not isinstance(r[2], int))
        raise ValueError(
            f"{file}:{first_str[0]}: label {first_str[2]!r} mixes string labels with integer labels"
        )
    if int_rows:
        negative = next((r for r in rows if isinstance(r[2], int) and r[2] < 0), None)
        if negative is not None:
            raise ValueError(f"{file}:{negative[0]}: integer labels must be >= 0, got {negative[2]}")
        ids = {r[2] for r in rows}
        names = BINARY_LABEL_NAMES if ids == {0, 1} else [f"LABEL_{i}" for i in range(max(map(int, ids)) + 1)]
        return [ClassificationExample(t, int(lab), pair) for _, t, lab, pair in rows], list(names)
    names = sorted({str(r[2]) for r in rows})
    index = {name: i for i, name in enumerate(names)}
    return [ClassificationExample(t, index[str(lab)], pair) for _, t, lab, pair in rows], names


# --------------------------------------------------------------------------- SQuAD


def load_squad(path: Path | str) -> list[QAExample]:
    """Flatten SQuAD v1.1 articles into one example per question, keeping the article title."""
    file = Path(path)
    try:
        with _reading(file) as handle:
            doc = json.load(handle)
    except json.JSONDecodeError as err:
        raise ValueError(f"{file}:{err.lineno}: invalid JSON: {err.msg}") from err
    articles = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(articles, list):
        raise ValueError(f"{file}: expected a top-level object with a 'data' list (SQuAD v1.1)")
    examples: list[QAExample] = []
    for a, article in enumerate(articles):
        where = f"data[{a}]"
        title = _field(file, where, article, "title", str)
        for p, paragraph in enumerate(_field(file, where, article, "paragraphs", list)):
            examples.extend(_paragraph_examples(file, f"{where}.paragraphs[{p}]", title, paragraph))
    return examples


def squad_document(examples: Sequence[QAExample]) -> dict[str, Any]:
    """Examples as a SQuAD v1.1 document: articles by title, paragraphs by context, in first-seen order."""
    articles: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(dict)
    for e in examples:
        questions = articles[e.title].setdefault(e.context, [])
        answers = [{"text": a.text, "answer_start": a.start} for a in e.answers]
        questions.append({"id": e.id, "question": e.question, "answers": answers})
    return {
        "version": "1.1",
        "data": [
            {"title": title, "paragraphs": [{"context": c, "qas": qas} for c, qas in paragraphs.items()]}
            for title, paragraphs in articles.items()
        ],
    }


def _paragraph_examples(file: Path, where: str, title: str, paragraph: Any) -> list[QAExample]:
    """Questions of one paragraph; answers are checked against the context so offsets are trustworthy."""
    context = _field(file, where, paragraph, "context", str)
    out: list[QAExample] = []
    for q, qa in enumerate(_field(file, where, paragraph, "qas", list)):
        qwhere = f"{where}.qas[{q}]"
        answers: list[Answer] = []
        for n, raw in enumerate(_field(file, qwhere, qa, "answers", list)):
            awhere = f"{qwhere}.answers[{n}]"
            text = _field(file, awhere, raw, "text", str)
            start = _field(file, awhere, raw, "answer_start", int)
            if context[start : start + len(text)] != text:
                raise ValueError(f"{file}: {awhere}: answer {text!r} is not in the context at {start}")
            answers.append(Answer(text=text, start=start))
        out.append(
            QAExample(
                id=str(_field(file, qwhere, qa, "id", (str, int))),
                title=title,
                question=_field(file, qwhere, qa, "question", str),
                context=context,
                answers=answers,
            )
        )
    return out


def _field(file: Path, where: str, obj: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    """Fetch a required JSON field with an error that points at the file and the JSON path."""
    if not isinstance(obj, dict):
        raise ValueError(f"{file}: {where}: expected a JSON object")
    value = obj.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{file}: {where}: missing or invalid {key!r}")
    return value


# --------------------------------------------------------------------------- plain text


def load_text(path: Path | str, skip_headings: bool = True) -> list[str]:
    """Non-empty stripped lines; WikiText headings are dropped because they are not prose."""
    lines: list[str] = []
    with _reading(Path(path)) as handle:
        for line in handle:
            stripped = line.strip()
            if stripped and not (skip_headings and is_heading(stripped)):
                lines.append(stripped)
    return lines


def load_text_data(path: Path | str, skip_headings: bool = True) -> TextData:
    """`load_text` with its source kept, for runs that report where their data came from."""
    lines = load_text(path, skip_headings)
    if not lines:
        raise ValueError(f"{path}: no text lines found")
    return TextData(lines=lines, source=str(path))


def is_heading(line: str) -> bool:
    """True for WikiText heading lines such as `= Title =` or `= = Section = =`."""
    return _HEADING.match(line.strip()) is not None


# --------------------------------------------------------------------------- splitting


def split_examples(
    items: Sequence[T],
    eval_fraction: float,
    seed: int,
    group: Callable[[T], Hashable] | None = None,
) -> tuple[list[T], list[T]]:
    """Seeded train/eval split; with `group`, whole groups go to one side so none leaks across.

    About `eval_fraction` of the items land in eval (whole groups when grouped); both parts keep
    the input order. Train is never empty; with a positive fraction and two or more groups,
    eval is not either.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    keys: list[Hashable] = [group(item) if group is not None else i for i, item in enumerate(items)]
    sizes: dict[Hashable, int] = {}
    for key in keys:
        sizes[key] = sizes.get(key, 0) + 1
    eval_keys = _pick_eval_groups(list(sizes), sizes, eval_fraction * len(items), random.Random(seed))
    train = [item for item, key in zip(items, keys, strict=True) if key not in eval_keys]
    evals = [item for item, key in zip(items, keys, strict=True) if key in eval_keys]
    return train, evals


def _pick_eval_groups(
    order: list[Hashable], sizes: dict[Hashable, int], target: float, rng: random.Random
) -> set[Hashable]:
    """Take shuffled groups while each one brings the eval size closer to the target."""
    rng.shuffle(order)
    chosen: list[Hashable] = []
    count = 0
    for key in order:
        if count + sizes[key] / 2 <= target:
            chosen.append(key)
            count += sizes[key]
    if target > 0 and not chosen and len(order) >= 2:
        chosen.append(order[0])
    if chosen and len(chosen) == len(order):
        chosen.pop()
    return set(chosen)
