"""Every knob of the service, read once at start-up from `DISTILSERVE_*` env vars and CLI flags."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Defaults serve a small model well on a CPU box; each field is `DISTILSERVE_<NAME>` and `--name`."""

    model_config = SettingsConfigDict(env_prefix="DISTILSERVE_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind.")
    model_repository: Path = Field(Path("models"), description="Model repository root (models/<name>/<v>/).")
    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="auto: CUDA when ONNX Runtime can use it, else CPU."
    )
    require_gpu: bool = Field(False, description="Fail start-up instead of falling back to CPU.")
    variant: Literal["auto", "fp32", "optimized", "fp16", "int8"] = Field(
        "auto",
        description="ONNX variant to serve; auto picks fp16 on GPU, int8 (if present) else fp32 on CPU.",
    )
    intra_op_threads: int = Field(0, ge=0, description="ONNX Runtime intra-op threads; 0 = one per core.")
    inter_op_threads: int = Field(1, ge=1, description="ONNX Runtime inter-op threads.")
    max_batch_size: int = Field(32, ge=1, description="Most requests (sequences) in one engine call.")
    max_batch_tokens: int = Field(
        8192, ge=1, description="Most padded tokens (batch size x longest sequence) in one engine call."
    )
    max_wait_ms: float = Field(
        0.0, ge=0, description="Extra wait for a fuller batch, only under load; 0 = never wait."
    )
    max_queue: int = Field(1024, ge=1, description="Queued sequences per model before answering 429.")
    request_timeout_s: float = Field(30.0, gt=0, description="Deadline of a request; past it: 504.")
    max_client_batch: int = Field(64, ge=1, description="Most inputs in one HTTP request.")
    warmup: bool = Field(True, description="Run the engine over the batch shapes before /ready turns 200.")
    strict_repository: bool = Field(False, description="Fail start-up if any model version is broken.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_cli(argv: list[str] | None = None) -> Settings:
    """Flags override env vars, which override defaults; `--help` lists every knob."""
    parser = argparse.ArgumentParser(
        prog="python -m service",
        description="Serve a distilserve model repository over HTTP. Every flag is also DISTILSERVE_<NAME>.",
    )
    for name, field in Settings.model_fields.items():
        env = "DISTILSERVE_" + name.upper()
        parser.add_argument(
            _flag(name),
            dest=name,
            default=None,
            help=f"{field.description} [env {env}; default {field.default}]",
        )
    given: dict[str, Any] = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    return Settings(**given)
