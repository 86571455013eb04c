"""benchmarks.traffic_loop end to end on conftest's tiny pair: the split keeps held-out texts apart, capture
keeps every served input's teacher answer, measure reads each version beside its teacher."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from benchmarks.traffic_loop import app
from common.capture import read
from training.traffic import words_of

SENTENCES = [
    ("A man is playing a flute.", "A man plays the flute."),
    ("A man is playing a flute.", "Two dogs run on the beach."),  # a repeat: one text
    ("Stocks fell sharply today", "Markets closed lower on Monday"),
    ("A woman slices an onion.", "Someone is cutting an onion"),
    ("The cat sat", "The cat sat on the mat, purring."),  # one lies inside the other
]


def test_split_capture_and_measure(pair_repository: Path, tmp_path: Path) -> None:
    stsb = tmp_path / "stsb.tsv"
    rows = ["index\tgenre\tsentence1\tsentence2\tscore"]
    rows += [f"{i}\tmain\t{a}\t{b}\t1.0" for i, (a, b) in enumerate(SENTENCES)]
    stsb.write_text("\n".join(rows) + "\n")
    runner = CliRunner()
    split = runner.invoke(app, ["split", "--stsb", str(stsb), "--out", str(tmp_path), "--heldout", "3"])
    assert split.exit_code == 0, split.output
    traffic = (tmp_path / "traffic.txt").read_text().splitlines()
    held = (tmp_path / "heldout.txt").read_text().splitlines()
    assert len(held) == 3 and len(set(traffic + held)) == len(traffic) + len(held)
    assert len(set(traffic) | set(held)) <= 8  # nine texts, one repeated
    for t in traffic:  # no served text lies inside a held-out one, nor contains one
        assert not any(words_of(t) in words_of(h) or words_of(h) in words_of(t) for h in held)

    texts = tmp_path / "served.txt"
    texts.write_text("I loved this film\nA dull film\nWho founded Acme?\n")
    capture = tmp_path / "capture"
    args = ["capture", "--repository", str(pair_repository), "--student", "cls", "--traffic", str(texts)]
    done = runner.invoke(app, [*args, "--capture", str(capture)])
    assert done.exit_code == 0, done.output
    records = list(read(capture / "cls"))
    # two untrained seeds never agree: calibrated, the teacher answers every input directly; each is kept
    assert sorted(str(r.input) for r in records) == sorted(texts.read_text().splitlines())
    assert {r.source for r in records} == {"teacher"}

    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(
        '{"text": "a fine film", "label": "positive"}\n{"text": "awful", "label": "negative"}\n'
    )
    out = tmp_path / "report"
    measure = [
        *("measure", "--repository", str(pair_repository), "--student", "cls:1", "--traffic", str(texts)),
        *("--eval", str(eval_file), "--out", str(out), "--seconds", "0"),
    ]
    measured = runner.invoke(app, measure)
    assert measured.exit_code == 0, measured.output
    result = json.loads((out / "traffic-loop-cls.json").read_text())
    assert result["teacher"] == "cls-teacher"
    (v1,) = result["versions"]
    assert v1["version"] == 1 and v1["traffic_sent"] == 1.0 and v1["traffic_cascade_agreement"] == 1.0
    assert v1["eval_sent"] == 1.0 and v1["eval_cascade_accuracy"] == result["teacher_eval_accuracy"]
    assert (out / "traffic-loop-cls.png").stat().st_size > 0
    assert "| 1 |" in (out / "traffic-loop-cls.md").read_text()


def test_measure_refuses_a_student_without_its_version(tmp_path: Path) -> None:
    texts, labelled = tmp_path / "traffic.txt", tmp_path / "eval.jsonl"
    texts.write_text("a text\n", encoding="utf-8")
    labelled.write_text(json.dumps({"text": "a text", "label": 0}) + "\n", encoding="utf-8")
    args = ["measure", "--repository", str(tmp_path), "--traffic", str(texts), "--eval", str(labelled)]
    for bad in ("sst2", "sst2:two", ":2"):
        result = CliRunner().invoke(app, [*args, "--student", bad])
        assert result.exit_code == 2, result.output
        assert "give name:version" in result.output and "Traceback" not in result.output
