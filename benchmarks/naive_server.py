"""The naive baseline: FastAPI + a transformers `pipeline` in PyTorch, one request at a time (sync endpoint).

    python -m benchmarks.naive_server MODEL_DIR --port 8100 [--device cuda]

What a first attempt at serving looks like; the benchmark compares distilserve with it on the same model.
"""

from __future__ import annotations

import sys

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import pipeline


class Body(BaseModel):
    inputs: str | list[str]


def create_app(model_dir: str, threads: int = 2, device: str = "cpu") -> FastAPI:
    torch.set_num_threads(threads)
    classifier = pipeline("text-classification", model=model_dir, device=device)
    app = FastAPI()

    @app.post("/v1/classify")
    def classify(body: Body) -> list:  # sync: FastAPI runs it in its thread pool, one pipeline call each
        return list(classifier(body.inputs))

    return app


if __name__ == "__main__":
    port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 8100
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
    uvicorn.run(create_app(sys.argv[1], device=device), host="127.0.0.1", port=port, log_level="warning")
