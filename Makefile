# The README's two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Torch first, pinned to the wheel these machines carry: a looser requirement with nothing
# installed yet would pull a multi-GB CUDA build. GPU machines get the CUDA build of it.
TORCH ?= torch==2.13.0

.PHONY: setup demo test lint typecheck unit bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) examples/demo.py

lint: setup
	$(VENV)/bin/ruff check hpinteract tests benchmarks examples

typecheck: setup
	$(VENV)/bin/mypy

# The browser test drives Debian's Chromium: installed here when we may (root, apt), as
# .ci/run does; elsewhere the test fails saying so (HPI_SKIP_BROWSER=1 leaves it out).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	else echo "note: the browser test needs $(CHROMIUM) (Debian's chromium package)"; fi

test: lint typecheck $(CHROMIUM)
	$(VENV)/bin/pytest -q

bench: setup
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/latency.py
	$(PY) benchmarks/monitor_overhead.py
	$(PY) benchmarks/gns_accuracy.py
	$(PY) benchmarks/adaptive_batch.py
	$(PY) benchmarks/dashboard_open.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
