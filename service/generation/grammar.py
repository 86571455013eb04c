"""Structured output: a grammar every generated token must keep the text inside (OpenAI's `response_format`
with a JSON schema, or any JSON object), by llguidance, the constraint engine vLLM, SGLang and llama.cpp use.

A frontend turns the request's schema into llguidance's grammar text (`json_grammar`, refusing a schema it
cannot compile) and sends it with the sampling parameters, as plain data. The engine core gives each such
sequence its own matcher (`Grammars.start`), built on the model's own tokenizer.json: before a token is
chosen, `GrammarState.allowed` says which tokens keep the text inside the grammar (the others' logits go to
-inf, after the bias and the penalties); each token the sequence keeps advances it. A draft's tokens advance
it tentatively and are taken back before the teacher's choice is recorded (service.generation.speculative).
Once the grammar is complete only the model's stop tokens are allowed, so the answer ends there.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.numpy
import numpy as np

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict of the stubs only

ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}  # OpenAI's {"type": "json_object"}
# JSON as Python's json.dumps writes it, one space after each separator and no other whitespace: llguidance's
# default lets whitespace run anywhere, and an unsure model fills its whole budget with it (a tiny one wrote
# 30 tabs after the "{"). A schema's own "x-guidance" options override these.
JSON_STYLE: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


def json_grammar(schema: dict[str, Any] | None) -> str:
    """llguidance's grammar text for a JSON schema (None: any JSON object); ValueError saying what is wrong
    with a schema it cannot compile."""
    return constraint_grammar("json", ANY_JSON_OBJECT if schema is None else schema)


CONSTRAINTS = ("json", "regex", "choice", "grammar")  # vLLM's structured_outputs keys


def constraint_grammar(kind: str, value: Any) -> str:
    """llguidance's grammar text for one of vLLM's constraints (`structured_outputs`, the older `guided_*`):
    `json` a JSON schema (an object, or its text), `regex` a regular expression the whole answer matches,
    `choice` a list of strings the answer is one of, `grammar` a Lark or GBNF grammar (llama.cpp's).
    ValueError saying what is wrong with one it cannot compile."""
    what = {"json": "schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}.get(kind)
    if what is None:
        raise ValueError(f"{kind!r} is not one of {', '.join(CONSTRAINTS)}")
    try:
        if kind == "json":
            schema = json.loads(value) if isinstance(value, str) else value
            if not isinstance(schema, dict):
                raise ValueError("a JSON schema is an object")
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_STYLE)
        elif kind == "choice":
            if not (isinstance(value, list) and value and all(isinstance(c, str) and c for c in value)):
                raise ValueError("a choice is a non-empty list of non-empty strings")
            grammar = llguidance.grammar_from("choice", json.dumps(value))
        elif not isinstance(value, str) or not value:
            raise ValueError(f"a {what} is a non-empty string")
        else:
            grammar = llguidance.grammar_from("regex" if kind == "regex" else "grammar", value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"the {what} cannot be compiled: {e}") from e
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    if problem:
        raise ValueError(f"the {what} cannot be compiled: {problem}")
    return grammar


class GrammarState:
    """One sequence's place in its grammar. Used on the engine thread only."""

    def __init__(self, matcher: llguidance.LLMatcher, stop_ids: np.ndarray, vocab: int) -> None:
        self._matcher = matcher
        self._stop_ids = stop_ids
        self._bits = llguidance.numpy.allocate_token_bitmask(1, vocab)
        self._vocab = vocab
        self.ahead = 0  # tokens advanced tentatively (a draft's), to be taken back

    def allowed(self, columns: int) -> np.ndarray:
        """Which of `columns` token ids may come next (bool). Where the matcher allows nothing (an error
        state: a token it refused was forced in), the stop ids, so the answer ends rather than loops."""
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._bits)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self._vocab].astype(bool)
        out = np.zeros(columns, dtype=bool)
        out[: min(columns, self._vocab)] = bits[:columns]
        if not out.any():
            out[self._stop_ids[self._stop_ids < columns]] = True
        return out

    def advance(self, token: int) -> None:
        """A token the sequence keeps."""
        if not self._matcher.is_stopped():
            self._matcher.consume_token(token)

    def try_ahead(self, token: int) -> None:
        """A draft's token: advanced now, taken back by `take_back`. Past the grammar's end (only a stop
        token can come) llguidance keeps no history of a token, so none is counted to take back."""
        if not self._matcher.is_stopped():
            self._matcher.consume_token(token)
            self.ahead += 1

    def take_back(self) -> None:
        if self.ahead:
            self._matcher.rollback(self.ahead)
            self.ahead = 0


class Grammars:
    """One decoder's grammars: llguidance's view of its tokenizer, built on first use and kept."""

    def __init__(self, tokenizer_file: Path, stop_ids: Iterable[int]) -> None:
        self._tokenizer_file = tokenizer_file
        self._stop_ids = sorted(set(stop_ids))
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    def start(self, grammar: str) -> GrammarState:
        """A matcher at the grammar's start, for one sequence."""
        tokenizer = self._llg_tokenizer()
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        return GrammarState(matcher, np.asarray(self._stop_ids, dtype=np.int64), tokenizer.vocab_size)

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                text = self._tokenizer_file.read_text(encoding="utf-8")
                self._tokenizer = llguidance.LLTokenizer(text, eos_token=self._stop_ids or None)
            return self._tokenizer
