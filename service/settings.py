"""Every knob of the service, read once at start-up from `DISTILSERVE_*` env vars and CLI flags."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Defaults serve a small model well on a CPU box; each field is `DISTILSERVE_<NAME>` and `--name`."""

    model_config = SettingsConfigDict(env_prefix="DISTILSERVE_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind.")
    grpc_port: int = Field(
        8001,
        ge=0,
        le=65535,
        description="Port of the Open Inference Protocol's gRPC service (KServe v2, what tritonclient.grpc "
        "speaks; 8001 as Triton's), on the same host, served by every frontend; 0: no gRPC.",
    )
    model_repository: Path = Field(Path("models"), description="Model repository root (models/<name>/<v>/).")
    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="auto: CUDA when ONNX Runtime can use it, else CPU."
    )
    require_gpu: bool = Field(False, description="Fail start-up instead of falling back to CPU.")
    io_binding: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Bind engine inputs and outputs on the device (ONNX Runtime IO binding) and keep a "
        "generation KV cache there between decode steps. auto: on with CUDA, off on a CPU (where plain "
        "runs are as fast); on: also on a CPU (tests the GPU's code path).",
    )
    graph_cache_dir: Path | None = Field(
        None,
        description="Keep ONNX Runtime's optimised graphs here between starts (keyed by the exported file's "
        "sha256, the runtime's version and this CPU): a later start or replica, or a version loaded again, "
        "opens them without optimising again. CPU sessions only; each graph takes about its model's size on "
        "disk. Unset: every start optimises.",
    )
    variant: Literal["auto", "fp32", "optimized", "fp16", "int8", "int4"] = Field(
        "auto",
        description="ONNX variant to serve; auto picks fp16 on GPU, and on CPU int8, else int4 (a model "
        "4-bit at its source) beside fp32 for a decoder (each call on the graph that runs it faster: "
        "service.generation.split_engine), else fp32. int4 named: int4 alone (faster at one stream, slower "
        "at many, a third of fp32's memory).",
    )
    frontends: int = Field(
        0,
        ge=0,
        description="HTTP frontend processes in front of the one engine core: each does HTTP, validation, "
        "tokenizing and post-processing (~0.5-1.4 ms of CPU a request), the core batches every frontend's "
        "requests together. 0 = auto: one on a machine of up to 4 cores, else one per 2 cores beyond the "
        "first 2, at most 8.",
    )
    engine_address: str = Field(
        "",
        description="Where a frontend reaches the engine core: a Unix socket, `unix:/run/ds/engine.sock`. "
        "`python -m service` sets it for the processes it starts; empty: the engine runs in-process.",
    )
    worker_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A frontend or engine core whose event loop has not ticked for this long (stuck, or "
        "stopped) is killed and started again. Checked once it has started.",
    )
    instances: int = Field(
        0,
        ge=0,
        description="Engine calls one model runs at once (Triton's instance count), sharing one session. "
        "0 = auto: one per core (of the worker's share) on a CPU, each on one thread; 1 on a GPU. "
        "Generation always runs one.",
    )
    intra_op_threads: int = Field(
        0,
        ge=0,
        description="ONNX Runtime intra-op threads per engine call; 0 = the worker's cores / instances "
        "(a decoder on a CPU: all cores or one, whichever ran a decode step faster at start-up).",
    )
    inter_op_threads: int = Field(1, ge=1, description="ONNX Runtime inter-op threads.")
    thread_spinning: Literal["auto", "run", "off"] = Field(
        "auto",
        description="run: ONNX Runtime's intra-op threads spin between a call's operators and sleep once "
        "it returns (one busy SmolLM2 decoder ~1.2x faster on 2 cores; a single-threaded call has none); "
        "off: they sleep between operators too, what several decoders busy at once need (two: 1.25x the "
        "tokens/s of run). auto: run where the repository holds one decoder at start-up (a student "
        "drafting for its served teacher counted with it), else off.",
    )
    max_batch_size: int = Field(32, ge=1, description="Most requests (sequences) in one engine call.")
    max_batch_tokens: int = Field(
        8192, ge=1, description="Most padded tokens (batch size x longest sequence) in one engine call."
    )
    max_wait_ms: float = Field(
        0.0, ge=0, description="Extra wait for a fuller batch, only under load; 0 = never wait."
    )
    min_padding_efficiency: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Real / padded tokens a batch keeps; other lengths wait for a batch of their own. "
        "Unset: 0.95 on CPU (compute-bound: a padded token costs what a real one does), 0.85 on a GPU.",
    )
    max_queue: int = Field(1024, ge=1, description="Queued sequences per model before answering 429.")
    latency_target_ms: float | None = Field(
        None,
        gt=0,
        description="A p99 latency target for encoder models' engine work (queue + run): each batch's cap "
        "and wait are picked from the engine's measured cost to hold it at the best throughput, "
        "max_batch_size and max_batch_tokens staying ceilings and max_wait_ms unused. Unset: fixed settings.",
    )
    cascade: Literal["on", "off"] = Field(
        "on",
        description="A student exported as a pair with its teacher hands inputs whose confidence is below "
        "the pair's calibrated threshold to the teacher (classification, QA, fill-mask); off: students "
        "answer alone. A request's own cascade_threshold applies either way.",
    )
    cascade_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="One threshold for every pair instead of each pair's calibrated one (0: the student "
        "answers everything).",
    )
    cascade_calibration: Literal["export", "live"] = Field(
        "export",
        description="Where a pair's default threshold comes from: export, the one its export calibrated on "
        "its eval data; live, recalibrated as it serves for the same target agreement, on the inputs the "
        "cascade sends and the shadow checks of the rest (needs DISTILSERVE_SHADOW_RATE > 0; the export's "
        "serves until 200 of each are seen).",
    )
    cascade_overload: Literal["student", "refuse"] = Field(
        "student",
        description="What a cascade does with its unsure inputs when the teacher cannot take them (its queue "
        "is full, its engine is away, or DISTILSERVE_CASCADE_BUDGET_MS is spent): student, the student's "
        "answers stand (counted in distilserve_cascade_kept_total, header X-Distilserve-Teacher-Busy; a pair "
        "whose teacher answers directly has the student answer instead); refuse, the request fails as the "
        "teacher alone would (429, 503, 504).",
    )
    cascade_budget_ms: float | None = Field(
        None,
        gt=0,
        description="How long a paired request may take, from when its engine work begins, before the "
        "teacher starts on its inputs: past it the student's answers stand (a request that spent it queued "
        "for the student skips the teacher; rows still queued for the teacher leave uncomputed; a teacher "
        "call whose rows have all started is waited for; a pair whose teacher answers directly has the "
        "student answer instead). Unset: the request's deadline (DISTILSERVE_REQUEST_TIMEOUT_S).",
    )
    cascade_margin: float | None = Field(
        None,
        ge=0.0,
        description="For a cross-encoder pair's ranking cascade, one margin for every pair instead of each "
        "pair's calibrated one: the teacher reads again a query's documents whose student logit is within "
        "it of the best (0: the student ranks alone).",
    )
    speculative: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Speculative decoding for a generation teacher served with its student (the student's "
        "manifest names it, same tokenizer): the student drafts, the teacher checks the drafts in one pass; "
        "greedy text is the teacher's own. auto: on when a student's decode step, timed at start-up, is at "
        "most a third of the teacher's.",
    )
    speculative_tokens: int = Field(
        5,
        ge=1,
        le=16,
        description="The most tokens the draft proposes per teacher step (k; with speculative_confidence a "
        "round ends sooner where the draft is unsure). 5, measured with confidence 0.4: SmolLM2 drafted by "
        "its draft variant, 1.93 tokens a teacher step for 0.80 draft passes a token, against 1.89 for "
        "1.02 at a fixed k of 2 (1.28x the teacher alone against 1.15x, served side by side).",
    )
    speculative_confidence: float = Field(
        0.4,
        ge=0.0,
        le=1.0,
        description="A draft round ends before its k-th token once the draft's last token had less than "
        "this probability under the draft (it is still checked); 0: always k. The teacher checks more "
        "positions for about the cost of one (a CPU step reads every weight once however many positions it "
        "takes), while each draft costs a draft step: spending them only where the draft is sure keeps more "
        "of them (SmolLM2: 0.53 of drafts kept at k 5 and 0.4, against 0.45 at a fixed 2 and 0.25 at a "
        "fixed 5).",
    )
    speculative_max_batch: int = Field(
        2,
        ge=0,
        description="Drafting only while at most this many sequences decode together (0: always): on a "
        "CPU the teacher checking k + 1 positions of many rows costs nearly k + 1 steps, so drafting that "
        "pays at one stream loses at sixteen (SmolLM2 with its draft variant, k 2: 1.31x at 1 stream, "
        "1.12x at 2, 0.97x at 4, 0.70x at 16); above it the teacher decodes alone, and the draft catches "
        "up on the running contexts once they thin out.",
    )
    speculative_draft: Literal["auto", "served"] = Field(
        "auto",
        description="What drafts: auto, a student's draft variant where its export wrote one (every weight "
        "8-bit, the output head too: used only to draft, on a CPU) and else the variant it serves; served: "
        "always the variant it serves.",
    )
    tool_call_parser: Literal["auto", "hermes", "llama3_json", "off"] = Field(
        "auto",
        description='How a chat answer to tool_choice "auto" (the default with tools) is read into tool '
        "calls: hermes, <tool_call> blocks (Hermes, Qwen, SmolLM2); llama3_json, the answer a JSON "
        '{"name", "parameters"} (Llama 3.1+); auto, llama3_json for a chat template that speaks of '
        '<|python_tag|>, else hermes; off: "auto" is refused.',
    )
    shadow_rate: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Share of a student's own answers its teacher checks too, after the client is answered, "
        "at the engine's lowest priority (shed first under load): live agreement as a metric. 0: none.",
    )
    capture_dir: Path | None = Field(
        None,
        description="Keep every input a student's teacher answers (the cascade's unsure inputs, shadow "
        "checks, a teacher answering directly) with both answers, as JSON lines under <dir>/<student>/, "
        "for `python -m training traffic` to make the next student's training data. Holds clients' "
        "texts. Unset: nothing kept.",
    )
    capture_max_mb: float = Field(
        1024.0, gt=0, description="Most megabytes one process writes of a student's traffic; then none."
    )
    embedding_documents: Literal["own", "teacher"] = Field(
        "own",
        description="Who embeds the documents an embedding student ranks (rerank, score, similarity, "
        "retrieve-then-read QA): own, the student, as it embeds the query; teacher, its teacher, through the "
        "passage cache, while the student embeds the query (asymmetric: a query's cost is the student's, "
        "and documents sent again cost nothing, as an index the teacher built).",
    )
    passage_cache: int = Field(
        4096,
        ge=0,
        description="Passage embeddings each frontend keeps for retrieve-then-read QA (/v1/qa with "
        "passages), keyed by the text's sha256 and the embedding model's name and version; the least "
        "recently used go first. 0: none kept.",
    )
    request_timeout_s: float = Field(30.0, gt=0, description="Deadline of a request; past it: 504.")
    gen_max_batch: int = Field(16, ge=1, description="Sequences decoded together by the generation engine.")
    gen_max_cached_tokens: int = Field(
        65536,
        ge=1,
        description="KV-cache positions reserved across running sequences (prompt + max_new_tokens).",
    )
    gen_max_waiting: int = Field(256, ge=1, description="Generation requests waiting to join before 429.")
    gen_prefix_cache_mb: int = Field(
        256,
        ge=0,
        description="Keys and values of prompts' first tokens kept per decoder, in blocks of 16 tokens, so "
        "that a prompt beginning as an earlier one did (a chat template's system turn, a shared preamble) is "
        "prefilled from where the shared blocks end; least recently used out. 0 = off.",
    )
    gen_prefill_tokens: int = Field(
        512,
        ge=1,
        description="Prompt positions (prompts x columns) in one prefill call: longer prompts are prefilled "
        "in chunks, so a call's logits and activations, which ONNX Runtime's arena keeps, stay bounded; "
        "while other sequences decode, one chunk a step, so they wait for a chunk, not a whole long prompt.",
    )
    gen_stream_interval_ms: float = Field(
        10.0,
        ge=0,
        description="A stream is written at most once per this many ms: its first token at once, tokens "
        "due sooner together (each still its own SSE event). 0 = every token as it comes.",
    )
    max_client_batch: int = Field(64, ge=1, description="Most inputs in one HTTP request.")
    warmup: bool = Field(True, description="Run the engine over the batch shapes before /ready turns 200.")
    strict_repository: bool = Field(False, description="Fail start-up if any model version is broken.")
    model_control: Literal["none", "poll", "explicit"] = Field(
        "none",
        description="What may change the served models without a restart. none: every version in the "
        "repository at start-up, until the next start. poll: the repository is re-read every "
        "repository_poll_s; each model serves its highest valid version, a new one is validated, loaded and "
        "warmed before it takes the traffic, and a superseded or removed one drains, then is unloaded. "
        "explicit: as poll, but only when /v2/repository/models/{name}/load or unload (or gRPC's "
        "RepositoryModelLoad/Unload) asks, behind the API key when keys are set.",
    )
    repository_poll_s: float = Field(
        15.0, gt=0, description="With model_control=poll: seconds between two reads of the repository."
    )
    max_body_bytes: int = Field(
        1024 * 1024, ge=1, description="Largest request body in bytes; a bigger one gets 413 unread."
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A connection must send a request's headers within this long of opening (or of its "
        "last answer), else 408 and closed: idle and trickling clients cannot hold the server.",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request's body must arrive within this long of its headers, else 408."
    )
    max_connections: int = Field(
        0,
        ge=0,
        description="Open connections (and requests) one frontend takes; beyond it new requests get 503 "
        "at once, those in flight go on. 0 = auto: 80 percent of the process's open-file limit, so a "
        "flood of connections is refused before the process runs out of file descriptors.",
    )
    max_text_chars: int = Field(100_000, ge=1, description="Most characters in one text; longer: 422.")
    truncation: Literal["truncate", "reject"] = Field(
        "truncate",
        description="Texts past the model's window: truncate (and say so in X-Distilserve-Truncated) or 422.",
    )
    api_keys: SecretStr = Field(
        SecretStr(""), description="Comma-separated API keys; when any is set, /v1 and /v2 need one."
    )
    api_keys_file: Path | None = Field(None, description="File with one API key per line (# comments).")
    protect_metrics: bool = Field(False, description="With API keys: /metrics needs a key too.")
    shutdown_grace_s: float = Field(
        30.0, ge=0, description="On SIGTERM: how long in-flight and queued requests get to finish."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    log_format: Literal["json", "text"] = Field(
        "json", description="Access log lines (logger distilserve.access): one JSON object, or text."
    )


def frontend_count(settings: Settings, cores: int | None = None) -> int:
    """`frontends`, or the automatic count: a small box keeps its cores for the engine."""
    if settings.frontends:
        return settings.frontends
    from service.engine import available_cores

    cores = cores or available_cores()
    return 1 if cores <= 4 else min(8, (cores - 2) // 2)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_cli(argv: list[str] | None = None, prog: str = "python -m service") -> Settings:
    """Flags override env vars, which override defaults; `--help` lists every knob."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Serve a distilserve model repository over HTTP. Every flag is also DISTILSERVE_<NAME>.",
    )
    for name, field in Settings.model_fields.items():
        env = "DISTILSERVE_" + name.upper()
        switch = field.annotation is bool  # `--require-gpu` alone means true; `--require-gpu 0` also works
        parser.add_argument(
            _flag(name),
            dest=name,
            default=None,
            nargs="?" if switch else None,
            const="true" if switch else None,
            help=f"{field.description} [env {env}; default {field.default}"
            + ("; alone: true]" if switch else "]"),
        )
    given: dict[str, Any] = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as e:  # a usage error (exit 2) naming the flag and its variable, not a traceback
        parser.error(
            "; ".join(
                f"{_flag(str(err['loc'][0]))} / DISTILSERVE_{str(err['loc'][0]).upper()}: {err['msg']}"
                if err["loc"]
                else err["msg"]
                for err in e.errors()
            )
        )
