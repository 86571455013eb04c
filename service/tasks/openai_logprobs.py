"""OpenAI's `logprobs` for the generation endpoints: each generated token's log-probability under the model's
own distribution (service.generation.sampling.token_logprob) and its most likely alternatives, in the two
shapes OpenAI uses.

- `/v1/completions` (`logprobs: N`, 0-5): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`,
  `top_logprobs` one `{token: logprob}` per token holding the N most likely and the chosen one (OpenAI's
  legacy rule: up to N + 1 entries), `text_offset` where each token's text starts in the answer.
- `/v1/chat/completions` (`logprobs: true`, `top_logprobs: N`, 0-20): `{"content": [{"token", "logprob",
  "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}`.

A token that is part of a character (byte-level BPE) has no text of its own: its `token` is written as
`bytes:\\xNN...` (vLLM's convention) and `bytes` holds the truth. Streamed, a chunk carries the entries of
its own tokens; a chat token that ends mid-character has no chunk, so its entry rides with the next one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.generation.sequence import TokenEvent

LEAST_LOGPROB = -9999.0  # OpenAI's floor: JSON has no -Infinity


class LogprobWriter:
    """One answer's log-probabilities in its endpoint's shape. `add` each token event as it comes; `take`
    returns what was added since the last take (None: nothing)."""

    def __init__(self, token_bytes: Callable[[int], bytes], chat: bool) -> None:
        self._token_bytes = token_bytes
        self._chat = chat
        self._pending: list[dict[str, Any]] = []
        self._offset = 0  # characters of the answer before the next token's text

    def add(self, event: TokenEvent) -> None:
        if event.token_id is not None and event.logprob is not None:
            logprob, alternatives = event.logprob
            chosen = self._entry(event.token_id, logprob)
            chosen["top"] = [self._entry(token, lp) for token, lp in alternatives]
            chosen["offset"] = self._offset
            self._pending.append(chosen)
        self._offset += len(event.text)

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
                        "top_logprobs": [{k: t[k] for k in ("token", "logprob", "bytes")} for t in e["top"]],
                    }
                    for e in entries
                ],
                "refusal": None,
            }
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [
                {t["token"]: t["logprob"] for t in [*e["top"], e]}
                for e in entries  # the chosen one too
            ],
            "text_offset": [e["offset"] for e in entries],
        }

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        raw = self._token_bytes(token)
        return {"token": token_text(raw), "logprob": max(logprob, LEAST_LOGPROB), "bytes": list(raw)}


def token_text(raw: bytes) -> str:
    """A token's text, or `bytes:\\xNN...` where its bytes are not whole UTF-8 characters."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)
