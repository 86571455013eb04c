"""A tool-call answer written under a grammar (service.tasks.openai_tools), read as it grows: each call's
name once it is whole, then its arguments' text as the model writes it, so a stream sends them as OpenAI
does (the call's id and name with its first fragment, then fragments of its arguments), and a whole answer
gives each call's arguments as the same text.

A named function's answer is its arguments, from the first token. "required"'s is a JSON array of
`{"name": ..., "parameters": ...}`, written as `json.dumps` writes it (service.generation.grammar's style):
a call's head is read up to its parameters, whose text is then followed to the bracket that closes it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_HEAD = re.compile(r'\s*[\[,]\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"parameters"\s*:\s*')
_CLOSE = re.compile(r"\s*\}")


@dataclass(frozen=True)
class Piece:
    """What a stream sends of a call: its place, its name with its first piece, a fragment of arguments."""

    call: int
    name: str | None
    arguments: str


@dataclass
class CallStream:
    """One answer's calls as they are read (`named`: the function a named tool_choice calls)."""

    named: str | None = None
    text: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, its arguments' text so far)
    _at: int = 0  # how much of the text is read
    _state: str = "head"  # reading a call's head, its arguments, or the brace that closes its object
    _depth: int = 0  # brackets open in the arguments being read
    _in_string: bool = False
    _escaped: bool = False

    def feed(self, text: str) -> list[Piece]:
        """The pieces `text`, the answer's next part, completes."""
        self.text += text
        if self.named is not None:
            first = not self.calls
            if first:
                self.calls.append((self.named, ""))
            if not (first or text):
                return []
            self.calls[0] = (self.named, self.calls[0][1] + text)
            return [Piece(0, self.named if first else None, text)]
        pieces = []
        while self._at < len(self.text):
            if self._state == "close":
                close = _CLOSE.match(self.text, self._at)
                if close is None:
                    break
                self._at, self._state = close.end(), "head"
            if self._state == "head":
                head = _HEAD.match(self.text, self._at)
                if head is None or head.end() == len(self.text):  # not yet whole, or no further call
                    break
                name = json.loads(head.group(1))
                self.calls.append((name, ""))
                self._at, self._state = head.end(), "arguments"
                pieces.append(Piece(len(self.calls) - 1, name, ""))
            start = self._at
            if self._read_arguments():
                self._state = "close"
            if self._at > start:
                name, written = self.calls[-1]
                self.calls[-1] = (name, written + self.text[start : self._at])
                pieces.append(Piece(len(self.calls) - 1, None, self.text[start : self._at]))
        return pieces

    def _read_arguments(self) -> bool:
        """Reads the arguments' text up to the bracket that closes them (True: it came), or to the end of
        what came."""
        while self._at < len(self.text):
            char = self.text[self._at]
            self._at += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return True
        return False
