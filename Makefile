# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean browser

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# The web page's test drives Debian's headless Chromium; where it cannot be
# installed (no apt, not root) that one test skips and says why.
browser:
	-@command -v chromium >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

demo: $(STAMP)
	$(BIN)/kvscope demo

test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python -m bench.policy_hit_ratio
	$(BIN)/python -m bench.hot_path
	$(BIN)/python -m bench.transfer_cpu

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
