"""Multi-turn chats through /v1/chat/completions, served with and without the prefix cache: how the time to
first token grows with a conversation's turns.

    python -m benchmarks.chat_turns --repository build/real/smollm2/models-picked --model smollm2-teacher \\
        --texts ../shared/data/wikitext2_raw_valid.txt --chats 4 --turns 6 --prefix-cache-mb 0,256

`--chats` clients hold a conversation each, at once: every turn sends the whole conversation so far (the
chat template's system turn, each question, each answer) and streams `--new-tokens` tokens of the answer
(greedy), which the next turn quotes before its new question (`--words` words of a WikiText paragraph), as
a chat client does. Each `--prefix-cache-mb` budget gets a fresh server, the budgets alternating `--rounds`
times. Reports per server and turn the TTFT (median over chats and rounds), the prompt's tokens and the
share the prefix cache had (OpenAI's usage.prompt_tokens_details.cached_tokens). Writes
OUT/chat-turns-MODEL.{md,json,png}.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console

from benchmarks.plots import saved_figure
from benchmarks.served_graphs import counts_of
from benchmarks.servers import serve
from benchmarks.streams import stream_chat
from common.cli import one_command_app
from common.progress import ProgressLog
from loadtests.texts import openings

console = Console(stderr=True)

Turn = dict[str, float]  # ttft_s, prompt_tokens, cached_tokens


async def ask(
    client: httpx.AsyncClient, model: str, messages: list[dict[str, str]], new_tokens: int
) -> tuple[str, Turn]:
    """One streamed answer: its text, the time to its first content, and the usage the server reported."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": new_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    answer = await stream_chat(client, body)
    cached = (answer.usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    turn = {"ttft_s": answer.ttft_s, "prompt_tokens": answer.usage["prompt_tokens"], "cached_tokens": cached}
    return answer.text, turn


async def chat(base: str, model: str, questions: list[str], new_tokens: int) -> list[Turn]:
    """One conversation, a turn a question, each answer quoted by the next turn."""
    messages: list[dict[str, str]] = []
    turns = []
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        for question in questions:
            messages.append({"role": "user", "content": question})
            answer, turn = await ask(client, model, messages, new_tokens)
            messages.append({"role": "assistant", "content": answer})
            turns.append(turn)
    return turns


def measure(
    repository: Path, env: dict[str, str], model: str, conversations: list[list[str]], new_tokens: int
) -> list[list[Turn]]:
    """Every conversation at once on a fresh server, after a one-turn warm-up on another question."""

    async def run(base: str) -> list[list[Turn]]:
        await chat(base, model, [conversations[0][-1][::-1]], 4)  # warm-up, on text no chat quotes
        return list(await asyncio.gather(*(chat(base, model, q, new_tokens) for q in conversations)))

    with serve(repository, env) as base:
        return asyncio.run(run(base))


def by_turn(results: list[list[list[Turn]]], key: str) -> list[float]:
    """The median of `key` at each turn, over rounds and chats."""
    turns = len(results[0][0])
    return [statistics.median(chat[t][key] for rnd in results for chat in rnd) for t in range(turns)]


def render(command: str, servers: dict[str, list[list[list[Turn]]]]) -> str:
    lines = [
        "# Multi-turn chats, TTFT by turn (python -m benchmarks.chat_turns)",
        "",
        f"`{command}`",
        "",
        "| server | turn | prompt tokens (median) | cached by the prefix cache | TTFT p50 ms |",
        "|---|---|---|---|---|",
    ]
    for name, results in servers.items():
        prompt, cached, ttft = (by_turn(results, k) for k in ("prompt_tokens", "cached_tokens", "ttft_s"))
        for t, (p, c, s) in enumerate(zip(prompt, cached, ttft, strict=True), 1):
            lines.append(f"| {name} | {t} | {p:.0f} | {c / p:.0%} | {1000 * s:.0f} |")
    return "\n".join(lines) + "\n"


def plot(path: Path, servers: dict[str, list[list[list[Turn]]]]) -> None:
    with saved_figure(path, (6.0, 3.8)) as (ax,):
        for name, results in servers.items():
            ttft = by_turn(results, "ttft_s")
            ax.plot(range(1, len(ttft) + 1), [1000 * s for s in ttft], marker="o", label=name)
        ax.set_xlabel("turn")
        ax.set_ylabel("TTFT p50, ms")
        ax.legend(fontsize=8)


def main(
    repository: Annotated[
        Path, typer.Option(help="Model repository holding --model (with a chat template).")
    ],
    model: Annotated[str, typer.Option(help="The chat model's name.")],
    texts: Annotated[Path, typer.Option(help="Questions: openings of this text file's paragraphs.")],
    chats: Annotated[int, typer.Option(min=1, help="Conversations held at once.")] = 4,
    turns: Annotated[int, typer.Option(min=1, help="Questions a conversation.")] = 6,
    words: Annotated[int, typer.Option(min=1, help="Words a question.")] = 30,
    new_tokens: Annotated[int, typer.Option(min=1, help="Tokens an answer (greedy; fewer at eos).")] = 48,
    prefix_cache_mb: Annotated[
        str, typer.Option(help="Comma list of DISTILSERVE_GEN_PREFIX_CACHE_MB.")
    ] = "0,256",
    rounds: Annotated[int, typer.Option(min=1, help="Alternating rounds of every budget.")] = 2,
    out: Annotated[Path, typer.Option(help="Directory of the report.")] = Path("docs/bench"),
) -> None:
    """TTFT by turn of concurrent multi-turn chats, each prefix-cache budget on a fresh server."""
    if not (repository / model).is_dir():
        raise typer.BadParameter(f"no {model} in {repository}", param_hint="--model")
    budgets = counts_of(prefix_cache_mb, "--prefix-cache-mb", 0)
    if not budgets:
        raise typer.BadParameter("one budget at least", param_hint="--prefix-cache-mb")
    questions = openings(texts, chats * turns, words=words, seed=17)
    conversations = [questions[i * turns : (i + 1) * turns] for i in range(chats)]
    servers: dict[str, list[list[list[Turn]]]] = {f"prefix cache {mb} MB": [] for mb in budgets}
    with ProgressLog("chat turns", rounds * len(budgets), unit="servers", active=True) as progress:
        for _ in range(rounds):
            for mb in budgets:
                progress.update(status=f"prefix cache {mb} MB")
                env = {"DISTILSERVE_GEN_PREFIX_CACHE_MB": mb}
                servers[f"prefix cache {mb} MB"].append(
                    measure(repository, env, model, conversations, new_tokens)
                )
                progress.update(advance=1)
    command = (
        f"python -m benchmarks.chat_turns --repository {repository} --model {model} --texts {texts} "
        f"--chats {chats} --turns {turns} --words {words} --new-tokens {new_tokens} "
        f"--prefix-cache-mb {prefix_cache_mb} --rounds {rounds}"
    )
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"chat-turns-{model}"
    report = render(command, servers)
    stem.with_suffix(".md").write_text(report)
    stem.with_suffix(".json").write_text(json.dumps({"command": command, "servers": servers}, indent=2))
    plot(stem.with_suffix(".png"), servers)
    console.print(report)


app = one_command_app(main, help=__doc__)

if __name__ == "__main__":
    app()
