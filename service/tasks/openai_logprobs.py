"""OpenAI's `logprobs` for the generation endpoints: each generated token's log-probability under the model's
own distribution (service.generation.sampling.token_logprob) and its most likely alternatives, in the two
shapes OpenAI uses.

- `/v1/completions` (`logprobs: N`, 0-5): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`,
  `top_logprobs` one `{token: logprob}` per token holding the N most likely and the chosen one (OpenAI's
  legacy rule: up to N + 1 entries), `text_offset` where each token's text starts in the answer. With
  `echo` the prompt's tokens come first, the very first with `null`s (nothing came before it to score it):
  how a client scores a text's likelihood (lm-evaluation-harness's `loglikelihood`).
- `/v1/chat/completions` (`logprobs: true`, `top_logprobs: N`, 0-20): `{"content": [{"token", "logprob",
  "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}`.

A token that is part of a character (byte-level BPE) has no text of its own: its `token` is written as
`bytes:\\xNN...` (vLLM's convention) and `bytes` holds the truth. Streamed, a chunk carries the entries of
its own tokens; a chat token that ends mid-character has no chunk, so its entry rides with the next one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from service.generation.sampling import Logprob
from service.generation.sequence import TokenEvent

LEAST_LOGPROB = -9999.0  # OpenAI's floor: JSON has no -Infinity


class Pieces(Protocol):
    def step(self, token_id: int) -> str | None: ...


class Speller(Protocol):
    """What the writer needs of the model's tokenizer (service.tokenization.TextEncoder)."""

    def token_bytes(self, token_id: int) -> bytes: ...

    def text_stream(self) -> Pieces: ...


class LogprobWriter:
    """One answer's log-probabilities in its endpoint's shape. `add` each token event as it comes; `take`
    returns what was added since the last take (None: nothing). `prompt`: the echoed prompt's token ids,
    whose entries come with the first event."""

    def __init__(self, speller: Speller, chat: bool, prompt: Sequence[int] | None = None) -> None:
        self._speller = speller
        self._chat = chat
        self._prompt = prompt
        self._pending: list[dict[str, Any]] = []
        self._offset = 0  # characters of the answer before the next token's text

    def add(self, event: TokenEvent) -> None:
        if event.prompt_logprobs is not None and self._prompt is not None:
            self._add_prompt(self._prompt, event.prompt_logprobs)
        if event.token_id is not None and event.logprob is not None:
            self._add_entry(event.token_id, event.logprob)
        self._offset += len(event.text)

    def _add_prompt(self, prompt: Sequence[int], logprobs: list[Logprob]) -> None:
        """The prompt's entries, its text's offsets as its tokens spell it (what `echo` writes)."""
        pieces = self._speller.text_stream()
        for i, token in enumerate(prompt):
            self._add_entry(token, logprobs[i - 1] if i else None)
            self._offset += len(pieces.step(token) or "")

    def _add_entry(self, token: int, logprob: Logprob | None) -> None:
        chosen = self._entry(token, logprob[0] if logprob is not None else None)
        chosen["top"] = [self._entry(t, lp) for t, lp in logprob[1]] if logprob is not None else None
        chosen["offset"] = self._offset
        self._pending.append(chosen)

    def take(self) -> dict[str, Any] | None:
        if not self._pending:
            return None
        entries, self._pending = self._pending, []
        if self._chat:
            return {
                "content": [
                    {
                        "token": e["token"],
                        "logprob": e["logprob"],
                        "bytes": e["bytes"],
                        "top_logprobs": [
                            {k: t[k] for k in ("token", "logprob", "bytes")} for t in e["top"] or ()
                        ],
                    }
                    for e in entries
                ],
                "refusal": None,
            }
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [  # the chosen one too; none for the echoed prompt's first token
                {t["token"]: t["logprob"] for t in [*e["top"], e]} if e["top"] is not None else None
                for e in entries
            ],
            "text_offset": [e["offset"] for e in entries],
        }

    def _entry(self, token: int, logprob: float | None) -> dict[str, Any]:
        raw = self._speller.token_bytes(token)
        floored = max(logprob, LEAST_LOGPROB) if logprob is not None else None
        return {"token": token_text(raw), "logprob": floored, "bytes": list(raw)}


def token_text(raw: bytes) -> str:
    """A token's text, or `bytes:\\xNN...` where its bytes are not whole UTF-8 characters."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)
