"""Every CLI's error is one line, whatever the terminal's width (issue 26: rich wrapped it at 80 columns)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from common.cli import cli_app, line_console, one_command_app, print_error, print_warning

ROOT = Path(__file__).resolve().parents[2]
LONG = "a message long enough to be wrapped at 40 columns, and at 80 too, were anything to wrap it at all"


def _line_with(output: str, start: str) -> str:
    (line,) = [line for line in output.splitlines() if start in line]
    return line


def _run_at_width(columns: int, command: list[str]) -> subprocess.Popen[str]:
    """The CLI as a user runs it, its output in a pipe, the terminal `columns` wide."""
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.parametrize("columns", [40, 300])
def test_the_cli_error_lines_are_single_lines_at_any_width(tmp_path: Path, columns: int) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    repository = tmp_path / "afile"
    repository.touch()
    rows = tmp_path / "one.jsonl"
    rows.write_text(json.dumps({"text": "a film", "label": "positive"}) + "\n")
    runs = {  # command -> (exit status, where the error starts, where it ends)
        ("export", str(model), "--task", "fill-mask", "--name", "m", "--repository", str(repository)): (
            2,
            f"error: repository {repository}",
            "is a file, not a directory",
        ),
        ("training", "teacher", "--preset", "bert-tiny", "--out", str(tmp_path / "out")): (
            2,
            "error: Invalid value for '--train': missing. Pass",
            "for demo data run `python -m training demo --out DIR`.",
        ),
        ("training", "split", str(rows), "--out", str(tmp_path / "split"), "--eval-fraction", "0"): (
            1,
            f"error: {rows}: 1 rows leave 0 for eval",
            "raise --eval-fraction or use a larger file",
        ),
    }
    started = {command: _run_at_width(columns, list(command)) for command in runs}  # side by side: ~5 s
    for command, process in started.items():
        output, _ = process.communicate(timeout=120)
        status, start, end = runs[command]
        assert process.returncode == status, output
        line = _line_with(output, start)
        assert line.startswith(start) and line.endswith(end), output


def test_usage_errors_are_plain_lines_and_help_stays_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    app = cli_app(help="Two commands.")

    @app.command()
    def first(count: int = typer.Option(1, "--count")) -> None:
        """The first."""
        if count > 9:
            raise typer.BadParameter(LONG, param_hint="'--count'")

    @app.command()
    def second() -> None:
        """The second."""

    refused = CliRunner().invoke(app, ["first", "--count", "10"])
    assert refused.exit_code == 2
    assert _line_with(refused.output, "error:") == f"error: Invalid value for '--count': {LONG}"
    assert "╭" not in refused.output  # no rich panel
    not_a_number = CliRunner().invoke(app, ["first", "--count", "many"])
    assert not_a_number.exit_code == 2 and "error: Invalid value for '--count'" in not_a_number.output
    assert CliRunner().invoke(app, ["first"]).exit_code == 0
    assert CliRunner().invoke(app, ["nosuch"]).exit_code == 2
    assert "╭" in CliRunner().invoke(app, ["--help"]).output  # rich help, as before


def test_a_one_command_app_exits_with_its_commands_status() -> None:
    def main(fail: bool = typer.Option(False, "--fail")) -> None:
        if fail:
            print_error(LONG)
            raise typer.Exit(1)

    app = one_command_app(main)
    assert CliRunner().invoke(app, []).exit_code == 0
    failed = CliRunner().invoke(app, ["--fail"])
    assert failed.exit_code == 1 and failed.output == f"error: {LONG}\n"


def test_errors_and_warnings_are_coloured_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    pipe, terminal = io.StringIO(), Terminal()
    print_error("bad", pipe)
    print_warning("left out", pipe)
    print_error("bad", terminal)
    assert pipe.getvalue() == "error: bad\nwarning: left out\n"
    assert terminal.getvalue() == "\x1b[31merror\x1b[0m: bad\n"
    monkeypatch.setenv("NO_COLOR", "1")
    print_error("bad", terminal)
    assert terminal.getvalue().endswith("\nerror: bad\n")


@pytest.mark.parametrize("columns", ["40", "300"])
def test_result_lines_are_never_wrapped(monkeypatch: pytest.MonkeyPatch, columns: str) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    out = io.StringIO()
    console = line_console()
    console.file = out
    console.print(f"student f1 0.5872 (teacher 0.6800) -> {LONG}")
    assert out.getvalue() == f"student f1 0.5872 (teacher 0.6800) -> {LONG}\n"
