"""Error lines every CLI prints the same way: one line each, whatever the terminal's width; and a console
whose result lines are never wrapped either.

rich (and typer, which draws usage errors in a rich panel) wraps text at the console's width: 80 columns
in a pipe or on many CI runners, so "… afile is\\na file, not a directory" breaks mid-phrase, and a grep
of a log or a test finds half a message. Here errors are plain text on stderr, never wrapped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from common.progress import is_terminal

_RED, _YELLOW, _RESET = "\x1b[31m", "\x1b[33m", "\x1b[0m"


def _print_line(label: str, color: str, message: str, stream: IO[str] | None) -> None:
    out = stream if stream is not None else sys.stderr
    if is_terminal(out) and "NO_COLOR" not in os.environ:
        label = f"{color}{label}{_RESET}"
    out.write(f"{label}: {message}\n")
    out.flush()


def line_console(stderr: bool = False) -> Console:
    """A rich console that never wraps a printed line at the terminal's width: a result line ("student f1
    0.5872 (teacher 0.6800) -> build/real/squad/student") cut before its path reads as two in a log. Tables
    and progress bars still fit the width."""
    return Console(stderr=stderr, soft_wrap=True)


def print_error(message: str, stream: IO[str] | None = None) -> None:
    """`error: <message>` on stderr as one line (red on a terminal): the user's to fix, whole in any log."""
    _print_line("error", _RED, message, stream)


def print_warning(message: str, stream: IO[str] | None = None) -> None:
    """`warning: <message>` on stderr as one line: something left out that the run survives."""
    _print_line("warning", _YELLOW, message, stream)


def _print_usage_error(error: typer.TyperException) -> None:
    """Usage, a hint, then `error: <message>`, each one line (click's own form wraps the usage line)."""
    if type(error).__name__ == "NoArgsIsHelpError":  # as typer tells it: the help itself is the message
        sys.stderr.write(error.format_message() + "\n" if error.format_message() else "")
        return
    ctx: typer.Context | None = getattr(error, "ctx", None)
    if ctx is not None:
        pieces = " ".join(ctx.command.collect_usage_pieces(ctx))
        sys.stderr.write(f"Usage: {ctx.command_path} {pieces}\n")
        if ctx.help_option_names:
            sys.stderr.write(f"Try '{ctx.command_path} {ctx.help_option_names[-1]}' for help.\n")
    print_error(error.format_message())


def _main_with_plain_errors(main: Callable[..., Any], standalone_mode: bool, **kwargs: Any) -> Any:
    """typer's main, except that usage errors are plain lines instead of typer's rich panel.

    Run in standalone mode, typer handles everything else as it would; the commands of these CLIs return
    None, so what it hands back is an exit code or nothing.
    """
    if not standalone_mode:
        return main(standalone_mode=False, **kwargs)
    try:
        code = main(standalone_mode=False, **kwargs)
    except typer.TyperException as error:  # click's exceptions (typer vendors click) derive from it
        _print_usage_error(error)
        sys.exit(error.exit_code)
    except typer.Abort:
        print_error("aborted")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


class _OneLineErrors:
    """`main` with usage errors as one line; mixed in before typer's group or command class."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        return _main_with_plain_errors(
            super().main,  # type: ignore[misc]
            standalone_mode,
            args=args,
            prog_name=prog_name,
            complete_var=complete_var,
            windows_expand_args=windows_expand_args,
            **extra,
        )


class OneLineErrorsGroup(_OneLineErrors, TyperGroup):
    """A typer app of several commands whose usage errors are one line (`typer.Typer(cls=...)`); --help
    stays typer's rich help."""


class OneLineErrorsCommand(_OneLineErrors, TyperCommand):
    """A one-command typer app whose usage errors are one line (`app.command(cls=...)`)."""


def cli_app(**settings: Any) -> typer.Typer:
    """A typer app of several commands whose errors are single lines.

    Tracebacks stay Python's own: typer's pretty ones are rich panels, wrapped like everything rich draws.
    """
    settings.setdefault("add_completion", False)
    return typer.Typer(cls=OneLineErrorsGroup, pretty_exceptions_enable=False, **settings)


def one_command_app(command: Callable[..., Any], **settings: Any) -> typer.Typer:
    """A typer app of one command (`prog ARGS`, no subcommand name) whose errors are single lines."""
    app = cli_app(**settings)
    app.command(cls=OneLineErrorsCommand)(command)
    return app
