# The README's two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Torch first, pinned to the wheel these machines carry: a looser requirement with nothing
# installed yet would pull a multi-GB CUDA build. GPU machines get the CUDA build of it.
TORCH ?= torch==2.13.0

# The JupyterLab extension: built by jlpm and jupyter-builder from the venv (both come with
# the jupyter_builder package), with Node.js from the machine.
LAB := labextension
LAB_BUILT := hpinteract/labextension/static/style.js
LAB_SRC := $(LAB)/package.json $(LAB)/tsconfig.json $(wildcard $(LAB)/src/*.ts $(LAB)/src/*/*.ts $(LAB)/style/*)
LAB_PATH := PATH="$(abspath $(VENV))/bin:$$PATH"

.PHONY: setup demo test lint typecheck unit bench clean labextension

# pip's build hook compiles the extension on a fresh clone (hatch-jupyter-builder); then
# the served copy is pointed at the build folder, so a rebuild needs no reinstall.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(LAB_PATH) $(PY) -m pip install -q -e ".[dev]"
	$(LAB_PATH) $(VENV)/bin/jupyter labextension develop --overwrite .
	touch $(STAMP)

$(LAB_BUILT): $(LAB_SRC) | $(STAMP)
	cd $(LAB) && $(LAB_PATH) jlpm install && $(LAB_PATH) jlpm build:prod
	touch $@

labextension: $(LAB_BUILT)

setup: $(STAMP) $(LAB_BUILT)

demo: setup
	$(PY) examples/demo.py

lint: setup
	$(VENV)/bin/ruff check hpinteract tests benchmarks examples
	cd $(LAB) && $(LAB_PATH) jlpm lint

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
	cd $(LAB) && $(LAB_PATH) jlpm test
	$(VENV)/bin/pytest -q

bench: setup
	$(PY) benchmarks/all.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache hpinteract/labextension \
	  $(LAB)/node_modules $(LAB)/lib $(LAB)/tsconfig.tsbuildinfo
