"""Captured traffic as training data: the teacher's answers become labels, held-out texts stay out, repeats
keep their latest record, and the files are the task's own formats its loaders read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from common.capture import Answered, Captured, Source, read
from training.cli import app
from training.data.loaders import load_classification, load_squad, load_text
from training.traffic import traffic_dataset

CONTEXT = "Acme was founded by John Smith in 1950 in the city of Springfield."


def record(
    given: str | tuple[str, str],
    teacher: dict[str, object],
    student: dict[str, object] | None = None,
    *,
    task: str = "text-classification",
    source: Source = "cascade",
    time: float = 1.0,
    version: int = 1,
) -> Captured:
    own = None if student is None else Answered("cls", 2, student)
    return Captured(task, source, given, Answered("cls-teacher", version, teacher), own, time)


def write(path: Path, records: list[Captured]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r.line() for r in records), encoding="utf-8")
    return path


def label(name: str, score: float = 0.9) -> dict[str, object]:
    return {"label": name, "score": score}


def test_records_round_trip_and_a_line_cut_short_at_the_end_is_skipped(tmp_path: Path) -> None:
    kept = [record("good film", label("positive"), label("negative")), record(("q", CONTEXT), label("x"))]
    path = write(tmp_path / "cap" / "cls" / "a.jsonl", kept)
    with path.open("a", encoding="utf-8") as f:
        f.write('{"task": "text-classification", "sou')  # a process stopped mid-write
    assert list(read(tmp_path / "cap")) == kept
    assert kept[0].agreed is False and kept[1].agreed is None  # scores aside; no student: unknown

    path.write_text(kept[0].line() + "not json\n" + kept[0].line())
    with pytest.raises(ValueError, match=r"a.jsonl:2: not a captured record"):
        list(read(path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no captured traffic"):
        list(read(tmp_path / "empty"))


def test_classification_keeps_the_original_data_first_then_the_teachers_labels(tmp_path: Path) -> None:
    original = tmp_path / "train.jsonl"
    original.write_text('{"text": "a fine film", "label": 1}\n{"text": "awful", "label": 0}\n')
    captures = write(
        tmp_path / "cap" / "cls" / "a.jsonl",
        [
            record("the news today", label("negative"), label("negative"), source="shadow", time=1.0),
            record("a long caption", label("positive"), label("negative"), time=2.0),
            record("the news today", label("positive"), label("negative"), time=3.0),  # again, later
        ],
    )
    out = tmp_path / "out.jsonl"
    counts = traffic_dataset("text-classification", [captures], out, train=original)
    data = load_classification(out)
    rows = [(e.text, data.label_names[e.label]) for e in data.examples]
    assert rows == [
        ("a fine film", "positive"),
        ("awful", "negative"),
        ("the news today", "positive"),  # its latest record, at its first place
        ("a long caption", "positive"),
    ]
    assert (counts.original, counts.kept, counts.repeated, counts.disagreed) == (2, 2, 1, 2)
    assert counts.read == {"shadow": 1, "cascade": 2}

    # the cascade's records alone, whose student disagreed: the shadow check's input first appears later
    only = traffic_dataset("text-classification", [captures], out, disagreed_only=True, sources=["cascade"])
    assert only.kept == 2 and only.read == {"cascade": 2}
    assert [e.text for e in load_classification(out).examples] == ["a long caption", "the news today"]


def test_inputs_touching_the_eval_texts_are_left_out(tmp_path: Path) -> None:
    captures = write(
        tmp_path / "c.jsonl",
        [
            record("I loved this film, it was wonderful", label("positive")),  # contains an eval text
            record("wonderful", label("positive")),  # lies inside one
            record("Loved   THIS film", label("positive")),  # words, case and spacing aside: inside
            record("a wonderfully dull film", label("negative")),  # shares words, no whole run
        ],
    )
    out = tmp_path / "out.jsonl"
    counts = traffic_dataset(
        "text-classification", [captures], out, eval_texts=["loved this film", "it was wonderful indeed"]
    )
    assert counts.inside_eval == 3 and counts.kept == 1
    assert [e.text for e in load_classification(out).examples] == ["a wonderfully dull film"]


def test_original_rows_are_a_seeded_sample_in_their_order(tmp_path: Path) -> None:
    original = tmp_path / "train.jsonl"
    original.write_text("".join(json.dumps({"text": f"t{i}", "label": i % 2}) + "\n" for i in range(50)))
    captures = write(tmp_path / "c.jsonl", [record("new", label("positive"))])
    out = tmp_path / "out.jsonl"
    traffic_dataset("text-classification", [captures], out, train=original, original_rows=10, seed=3)
    texts = [e.text for e in load_classification(out).examples]
    assert len(texts) == 11 and texts[-1] == "new"
    indices = [int(t[1:]) for t in texts[:-1]]
    assert indices == sorted(indices) and len(set(indices)) == 10
    traffic_dataset(
        "text-classification", [captures], tmp_path / "again.jsonl", train=original, original_rows=10, seed=3
    )
    assert (tmp_path / "again.jsonl").read_text() == out.read_text()


def test_a_teacher_label_the_training_data_lacks_is_refused(tmp_path: Path) -> None:
    original = tmp_path / "train.jsonl"
    original.write_text('{"text": "a", "label": "positive"}\n{"text": "b", "label": "negative"}\n')
    captures = write(tmp_path / "c.jsonl", [record("x", label("neutral"))])
    with pytest.raises(ValueError, match="'neutral', not one of the training file's labels"):
        traffic_dataset("text-classification", [captures], tmp_path / "o.jsonl", train=original)
    mixed = write(
        tmp_path / "m.jsonl", [record("x", label("positive")), record(("q", "d"), label("positive"))]
    )
    with pytest.raises(ValueError, match="mix single texts and pairs"):
        traffic_dataset("text-classification", [mixed], tmp_path / "o.jsonl")


def test_qa_spans_become_squad_answers_and_spans_not_in_their_context_are_dropped(tmp_path: Path) -> None:
    def span(start: int, end: int) -> dict[str, object]:
        return {"answer": CONTEXT[start:end], "score": 0.5, "start": start, "end": end}

    good = CONTEXT.index("John Smith")
    captures = write(
        tmp_path / "c.jsonl",
        [
            record(("Who founded Acme?", CONTEXT), span(good, good + 10), task="question-answering"),
            record(
                ("When?", CONTEXT),
                {"answer": "1950", "score": 0.4, "start": 0, "end": 4},
                task="question-answering",
            ),
            record(
                ("Where?", CONTEXT),
                {"answer": "", "score": 0.9, "start": 0, "end": 0},
                task="question-answering",
            ),
            record("a text", label("positive")),  # another task's record
        ],
    )
    out = tmp_path / "train.json"
    counts = traffic_dataset("question-answering", [captures], out)
    assert (counts.kept, counts.unusable, counts.other_tasks) == (1, 2, 1)
    (example,) = load_squad(out)
    assert (example.question, example.answers[0].text, example.answers[0].start) == (
        "Who founded Acme?",
        "John Smith",
        good,
    )


def test_fill_mask_traffic_is_the_teachers_filled_sentence(tmp_path: Path) -> None:
    answer = {
        "token": 7,
        "token_str": "founded",
        "score": 0.3,
        "sequence": "acme was  founded by john smith.",
    }
    captures = write(
        tmp_path / "c.jsonl", [record("acme was [MASK] by john smith.", answer, task="fill-mask")]
    )
    original = tmp_path / "train.txt"
    original.write_text("a first line\n")
    out = tmp_path / "text.txt"
    traffic_dataset("fill-mask", [captures], out, train=original)
    assert load_text(out) == ["a first line", "acme was founded by john smith."]


def test_the_cli_writes_the_file_and_its_report(tmp_path: Path) -> None:
    captures = write(
        tmp_path / "cap" / "cls" / "a.jsonl", [record("a caption", label("positive"), label("negative"))]
    )
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("a caption\n")
    out = tmp_path / "train.jsonl"
    args = ["traffic", str(tmp_path / "cap"), "--out", str(out), "--eval", str(heldout)]
    runner = CliRunner()
    refused = runner.invoke(app, args)  # the one input is a held-out text: nothing left to write
    assert refused.exit_code == 1 and "nothing to write" in refused.output
    heldout.write_text("something else\n")
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    report = json.loads(Path(f"{out}.report.json").read_text())
    assert (report["kept"], report["disagreed"], report["teachers"]) == (1, 1, {"cls-teacher:1": 1})
    assert captures.exists() and out.read_text().strip() == '{"text": "a caption", "label": "positive"}'
    wrong = runner.invoke(app, [*args, "--sources", "cascade,guess"])
    assert wrong.exit_code == 2 and "--sources" in wrong.output


def test_a_calibration_share_of_the_traffic_is_kept_apart_from_training(tmp_path: Path) -> None:
    captures = write(tmp_path / "c.jsonl", [record(f"caption {i}", label("positive")) for i in range(10)])
    original = tmp_path / "train.jsonl"
    original.write_text(
        '{"text": "a fine film", "label": "positive"}\n{"text": "awful", "label": "negative"}\n'
    )
    out, calibration = tmp_path / "train-out.jsonl", tmp_path / "calibration.jsonl"
    counts = traffic_dataset(
        "text-classification", [captures], out, train=original, calibration=calibration, calibration_share=0.3
    )
    trained = [e.text for e in load_classification(out).examples]
    held = [e.text for e in load_classification(calibration).examples]
    assert (counts.kept, counts.calibration, len(held)) == (7, 3, 3)
    assert trained[:2] == ["a fine film", "awful"]  # the original data trains, and only there
    assert not set(held) & set(trained) and set(held) | set(trained[2:]) == {
        f"caption {i}" for i in range(10)
    }
    with pytest.raises(ValueError, match="calibration share"):
        traffic_dataset(
            "text-classification", [captures], out, calibration=calibration, calibration_share=1.0
        )
