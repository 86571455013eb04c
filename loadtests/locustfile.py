"""Mixed traffic over the four task endpoints, as a deployed distilserve's clients send it.

Headless (`make loadtest` runs this and writes a report), or with the web UI (`docker compose --profile
loadtest up -d locust`, then http://localhost:8089):

    .venv/bin/locust -f loadtests/locustfile.py --host http://127.0.0.1:8000 --headless -u 16 -r 4 -t 1m

What one user does, by task weight (out of 100):
- 30 classification: one text (24) or a list of 2-8 (6);
- 16 question answering: one question over a context of 1-17 paragraphs (the longest span several
  windows) (12), or 2-4 questions at once (4);
- 14 fill-mask: one short or medium text with a word masked (10) or a list of 2-4 (4);
- 18 generation: a short prompt, 8-64 new tokens, greedy or sampled, whole (8) or streamed as
  Server-Sent Events (10);
- 6 OpenAI completions (/v1/completions), the same prompts, whole (2), streamed (2) or constrained (2) to
  a choice of labels or a regex (vLLM's structured_outputs: the answer is checked against it);
- 8 Open Inference Protocol (/v2/models/NAME/infer, JSON): one to four texts for a task's model, picked
  at random among those served;
- 8 deliberate bad requests (empty or wrongly typed inputs, unknown fields, no mask, an unknown model,
  a body that is not JSON, token ids for embeddings), each a success only when it gets its 4xx;
- where a sentence-embeddings model is served, 10 more: OpenAI embeddings of 1-8 texts (6), and a rerank of
  2-16 reviews against a question, the best 3 back (4).
A task whose model the server does not serve (GET /v1/models) is never picked, and the weights split a
user's time among the rest, so any repository can be loaded: the demo's, or one of embedding models alone.

Texts are mostly short (a few to 30 tokens), some medium, a few long enough to be truncated to the
model's window, as in real traffic. A 429 (queue full) is a failure named "429 Too Many Requests" so the
report can tell it from real ones. A streamed generation's response time is the whole stream; its time to
the first token is a row of its own ("SSE" / "/v1/generate [stream] first token", and the same for
/v1/completions).

With --csv PREFIX, PREFIX_final_stats.csv and PREFIX_final_failures.csv are written at the very end:
locust's own PREFIX_stats.csv is rewritten only once a second and misses what finished after that.

Env: LOADTEST_API_KEY (sent as a bearer token when the service wants keys).
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
import time
from collections.abc import Callable
from typing import Any, cast

from locust import HttpUser, between, events, task
from locust.clients import ResponseContextManager
from locust.env import Environment
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from loadtests.texts import CONTEXT, QUESTIONS, review

FILLER = (
    "The annual report lists the board members, the auditors and the yearly figures. "
    "Sales grew in the north and fell slightly in the south, while costs stayed flat. "
)
# (path, body or raw text, expected status, what is wrong)
BAD_REQUESTS: list[tuple[str, dict[str, Any] | str, int]] = [
    ("/v1/classify", {"inputs": ""}, 422),
    ("/v1/classify", {"inputs": 42}, 422),
    ("/v1/classify", {"inputs": "fine", "topk": 3}, 422),  # unknown field (a typo of top_k)
    ("/v1/classify", {"inputs": "fine", "model": "no-such-model"}, 404),
    ("/v1/classify", "inputs=not+json", 415),
    ("/v1/qa", {"question": "Who founded Acme?"}, 422),  # no context
    ("/v1/fill-mask", {"inputs": "there is no mask token here"}, 422),
    ("/v1/generate", {"prompt": "The film was", "max_new_tokens": 0}, 422),
    ("/v1/embeddings", {"input": [[101, 2023, 102]]}, 400),  # token ids: OpenAI's shape, refused by name
]
TASK_OF_PATH = {
    "/v1/classify": "text-classification",
    "/v1/qa": "question-answering",
    "/v1/fill-mask": "fill-mask",
    "/v1/generate": "text-generation",
    "/v1/embeddings": "sentence-embeddings",
}


def text_of_some_length(rng: random.Random) -> str:
    """70 % short (1-2 clauses), 25 % medium (3-8), 5 % long (20-40: past a 128-token window)."""
    roll = rng.random()
    if roll < 0.70:
        return review(rng, max_clauses=1)
    if roll < 0.95:
        return review(rng, max_clauses=rng.randint(3, 8))
    return " ".join(review(rng, max_clauses=3) + "." for _ in range(rng.randint(10, 20)))


def context_of_some_length(rng: random.Random) -> str:
    """The answer-bearing paragraph among 0-16 others: long contexts are split into windows."""
    paragraphs = [FILLER] * rng.choice([0, 0, 0, 1, 2, 4, 8, 16])
    paragraphs.insert(rng.randint(0, len(paragraphs)), CONTEXT + " ")
    return "".join(paragraphs).strip()


TaskFunction = Callable[..., None]


def needs(task_name: str) -> Callable[[TaskFunction], TaskFunction]:
    """Mark a locust task as one that only makes sense where a model serves `task_name`."""

    def mark(function: TaskFunction) -> TaskFunction:
        function.needs = task_name  # type: ignore[attr-defined]
        return function

    return mark


class ServiceUser(HttpUser):
    wait_time = between(0.05, 0.5)  # think time between one user's requests

    def on_start(self) -> None:
        self.rng = random.Random()
        if key := os.environ.get("LOADTEST_API_KEY"):
            self.client.headers["Authorization"] = f"Bearer {key}"
        self.mask = "[MASK]"
        self.models: dict[str, str] = {}  # task -> the name of a model serving it (for /v2)
        with self.client.get("/v1/models", name="/v1/models", catch_response=True) as r:
            if r.status_code == 200:
                cards = r.json()["models"]
                self.mask = next((c["mask_token"] for c in cards if c["mask_token"]), self.mask)
                self.models = {c["task"]: c["name"] for c in cards}
        # Only what is served is picked, so the weights split this user's time among the served tasks
        # (an embedding-only repository gets all its traffic as embeddings and reranks).
        self.tasks = [t for t in type(self).tasks if self.serves(getattr(t, "needs", None))]

    # -- helpers --------------------------------------------------------------------------------------

    def serves(self, task_name: str | None) -> bool:
        """A model serves `task_name` (the demo's four tasks are assumed where /v1/models was unreadable);
        None: a task any service takes."""
        if task_name is None:
            return True
        return task_name in self.models or (not self.models and task_name != "sentence-embeddings")

    def post(
        self,
        path: str,
        body: dict[str, Any] | str,
        name: str,
        expect: int = 200,
        valid: Callable[[Any], bool] = lambda _: True,
    ) -> None:
        """POST and judge: success only for the expected status (and, for a 200, a body `valid` accepts)."""
        kwargs: dict[str, Any] = (
            {"json": body}
            if isinstance(body, dict)
            else {"data": body, "headers": {"content-type": "text/plain"}}
        )
        with self.client.post(path, name=name, catch_response=True, **kwargs) as r:
            if r.status_code == expect and (expect != 200 or judge(valid, r)):
                r.success()
            else:
                fail(r, expect)

    def masked(self) -> str:
        """A short or medium text with one of its first dozen words masked (the mask stays in the window)."""
        words = review(self.rng, max_clauses=self.rng.choice([0, 1, 2, 4])).split()
        words[self.rng.randrange(min(len(words), 12))] = self.mask
        return " ".join(words)

    def stream(
        self, path: str, body: dict[str, Any], first_token: Callable[[dict[str, Any]], bool], final: str
    ) -> None:
        """POST a streamed request and read its Server-Sent Events: a success when the stream ends with
        `final` (an event holding that key, or that raw data) after a token, with no error event on the way.
        Its response time is the whole stream; the first token's time is fired as an "SSE" row."""
        started = time.perf_counter()
        first_token_s: float | None = None
        ended = False
        name = f"{path} [stream]"
        with self.client.post(path, json=body, name=name, stream=True, catch_response=True) as r:
            if r.status_code != 200:
                fail(r, 200)
                return
            for line in r.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                data = line[len(b"data: ") :]
                if data == final.encode():
                    ended = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    r.failure(f"error event: {event['error']}")
                    return
                if final in event:
                    ended = True
                elif first_token_s is None and first_token(event):
                    first_token_s = time.perf_counter() - started
            # The whole stream, not only its headers, is this request's response time.
            cast(dict[str, Any], r.request_meta)["response_time"] = (time.perf_counter() - started) * 1000
            if not ended or first_token_s is None:
                r.failure("the stream ended without tokens or without its final event")
                return
            r.success()
        self.environment.events.request.fire(
            request_type="SSE",
            name=f"{name} first token",
            response_time=first_token_s * 1000,
            response_length=0,
            exception=None,
            context={},
        )

    def generation_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": review(self.rng, max_clauses=self.rng.choice([0, 1, 2])),
            "max_new_tokens": self.rng.choice([8, 16, 16, 32, 64]),
            "truncate_prompt": True,  # a small model's window: keep the prompt's end rather than a 422
        }
        if self.rng.random() < 0.4:
            body.update(temperature=0.8, top_p=0.9)
        return body

    def completion_body(self) -> dict[str, Any]:
        """OpenAI's names for the same prompts and lengths as /v1/generate's."""
        body = self.generation_body()
        completion = {"prompt": body["prompt"], "max_tokens": body["max_new_tokens"], "truncate_prompt": True}
        return completion | {k: body[k] for k in ("temperature", "top_p") if k in body}

    # -- tasks ----------------------------------------------------------------------------------------

    @task(24)
    @needs("text-classification")
    def classify(self) -> None:
        self.post("/v1/classify", {"inputs": text_of_some_length(self.rng)}, "/v1/classify", valid=is_list)

    @task(6)
    @needs("text-classification")
    def classify_list(self) -> None:
        texts = [text_of_some_length(self.rng) for _ in range(self.rng.randint(2, 8))]
        body = {"inputs": texts, "top_k": 2}
        self.post("/v1/classify", body, "/v1/classify [list]", valid=lambda out: len(out) == len(texts))

    @task(12)
    @needs("question-answering")
    def qa(self) -> None:
        body = {"question": self.rng.choice(QUESTIONS), "context": context_of_some_length(self.rng)}
        self.post("/v1/qa", body, "/v1/qa", valid=lambda out: "answer" in out)

    @task(4)
    @needs("question-answering")
    def qa_list(self) -> None:
        pairs = [
            {"question": self.rng.choice(QUESTIONS), "context": context_of_some_length(self.rng)}
            for _ in range(self.rng.randint(2, 4))
        ]
        self.post("/v1/qa", {"inputs": pairs}, "/v1/qa [list]", valid=lambda out: len(out) == len(pairs))

    @task(10)
    @needs("fill-mask")
    def fill_mask(self) -> None:
        self.post("/v1/fill-mask", {"inputs": self.masked(), "top_k": 5}, "/v1/fill-mask", valid=is_list)

    @task(4)
    @needs("fill-mask")
    def fill_mask_list(self) -> None:
        texts = [self.masked() for _ in range(self.rng.randint(2, 4))]
        self.post(
            "/v1/fill-mask",
            {"inputs": texts},
            "/v1/fill-mask [list]",
            valid=lambda out: len(out) == len(texts),
        )

    @task(8)
    @needs("text-generation")
    def generate(self) -> None:
        self.post(
            "/v1/generate", self.generation_body(), "/v1/generate", valid=lambda out: "finish_reason" in out
        )

    @task(10)
    @needs("text-generation")
    def generate_stream(self) -> None:
        body = {**self.generation_body(), "stream": True}
        self.stream("/v1/generate", body, lambda event: "token" in event, final="finish_reason")

    @task(2)
    @needs("text-generation")
    def completion(self) -> None:
        self.post("/v1/completions", self.completion_body(), "/v1/completions", valid=has_choices)

    @task(2)
    @needs("text-generation")
    def completion_stream(self) -> None:
        body = {**self.completion_body(), "stream": True}
        self.stream("/v1/completions", body, lambda event: bool(event["choices"]), final="[DONE]")

    @task(2)
    @needs("text-generation")
    def completion_constrained(self) -> None:
        constraint, accepts = self.rng.choice(CONSTRAINTS)
        body = self.completion_body() | {"max_tokens": 24, "structured_outputs": constraint}
        self.post(
            "/v1/completions",
            body,
            "/v1/completions [constrained]",
            valid=lambda out: (
                out["choices"][0]["finish_reason"] == "length" or accepts(out["choices"][0]["text"])
            ),
        )

    @task(8)
    def v2_infer(self) -> None:
        """A task's inputs as Open Inference Protocol BYTES tensors, for one model served."""
        if not self.models:
            return
        task_name, model = self.rng.choice(sorted(self.models.items()))
        count = self.rng.randint(1, 4)
        parameters: dict[str, Any] = {}
        if task_name == "question-answering":
            tensors = {
                "QUESTION": [self.rng.choice(QUESTIONS) for _ in range(count)],
                "CONTEXT": [context_of_some_length(self.rng) for _ in range(count)],
            }
        elif task_name == "fill-mask":
            tensors = {"TEXT": [self.masked() for _ in range(count)]}
        elif task_name == "text-generation":
            tensors = {"PROMPT": [self.generation_body()["prompt"]]}
            parameters = {"max_new_tokens": self.rng.choice([8, 16, 32]), "truncate_prompt": True}
        else:
            tensors = {"TEXT": [text_of_some_length(self.rng) for _ in range(count)]}
        inputs = [{"name": n, "shape": [len(d)], "datatype": "BYTES", "data": d} for n, d in tensors.items()]
        body = {"inputs": inputs, **({"parameters": parameters} if parameters else {})}
        name = f"/v2/models/[{task_name}]/infer"
        self.post(f"/v2/models/{model}/infer", body, name, valid=lambda out: bool(out["outputs"]))

    @task(8)
    def bad_request(self) -> None:
        path, body, expect = self.rng.choice(
            [bad for bad in BAD_REQUESTS if self.serves(TASK_OF_PATH[bad[0]])] or BAD_REQUESTS[:1]
        )
        self.post(path, body, f"{path} [bad -> {expect}]", expect=expect)

    @task(6)
    @needs("sentence-embeddings")
    def embeddings(self) -> None:
        texts = [text_of_some_length(self.rng) for _ in range(self.rng.randint(1, 8))]
        body = {"input": texts}
        self.post("/v1/embeddings", body, "/v1/embeddings", valid=lambda out: len(out["data"]) == len(texts))

    @task(4)
    @needs("sentence-embeddings")
    def rerank(self) -> None:
        documents = [review(self.rng) for _ in range(self.rng.randint(2, 16))]
        body = {"query": self.rng.choice(QUESTIONS), "documents": documents, "top_n": 3}
        best = min(3, len(documents))
        self.post("/v1/rerank", body, "/v1/rerank", valid=lambda out: len(out["results"]) == best)


LABELS = ["positive", "negative", "mixed"]
CONSTRAINTS: list[tuple[dict[str, Any], Callable[[str], bool]]] = [
    ({"choice": LABELS}, lambda text: text in LABELS),
    ({"regex": "[1-5] stars?"}, lambda text: re.fullmatch("[1-5] stars?", text) is not None),
]


def judge(valid: Callable[[Any], bool], r: ResponseContextManager) -> bool:
    try:
        return valid(r.json())
    except (ValueError, KeyError, TypeError):
        return False


def has_choices(out: Any) -> bool:
    return bool(out["choices"]) and "text" in out["choices"][0]


def is_list(out: Any) -> bool:
    return isinstance(out, list) and bool(out)


def fail(r: ResponseContextManager, expected: int) -> None:
    if r.status_code == 429:
        r.failure("429 Too Many Requests (queue full)")
    else:
        r.failure(f"{r.status_code or 'no response'} (expected {expected}): {(r.text or '')[:200]}")


@events.test_stop.add_listener
def write_final_csvs(environment: Environment, **_: Any) -> None:
    """The totals once every user has stopped (locust's periodic CSVs can lag by up to a second)."""
    prefix = getattr(environment.parsed_options, "csv_prefix", None)
    if not prefix:
        return
    stats = StatsCSV(environment, PERCENTILES_TO_REPORT)
    with open(f"{prefix}_final_stats.csv", "w", newline="") as f:
        stats.requests_csv(csv.writer(f))
    with open(f"{prefix}_final_failures.csv", "w", newline="") as f:
        stats.failures_csv(csv.writer(f))
