# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_STAMP := $(VENV)/.vllm-installed

.PHONY: demo test lint bench clean debs vendor

# The web page's one third-party library, uPlot (package.json pins it, package-lock.json
# its checksum): installed by npm without running any package script, and its browser
# build, stylesheet and licence copied into the package (app/static/vendor/, gitignored,
# shipped by pyproject.toml's package-data and copied into the image from the build
# context). The page serves them itself: no CDN at run time, no build tool to run.
VENDOR := app/static/vendor
VENDOR_STAMP := $(VENDOR)/.vendored
VENDORED := node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css \
	node_modules/uplot/LICENSE
$(VENDOR_STAMP): package.json package-lock.json
	@command -v npm >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null) || \
		{ echo "make: npm is needed to vendor the web page's uPlot (apt-get install npm)"; exit 1; }
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	rm -rf $(VENDOR) && mkdir -p $(VENDOR)
	cp $(VENDORED) $(VENDOR)/
	touch $@

vendor: $(VENDOR_STAMP)

# setup.py and the C sources too: the editable install builds the C forms in place.
$(STAMP): pyproject.toml setup.py $(wildcard offload/*.h offload/*/*.c offload/*/*/*.c)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev,worker]'
	touch $(STAMP)

# The vLLM compatibility tier (tests/vllm): the real vllm==0.33.0 package,
# installed without its dependencies (they pin a CUDA torch), plus what its
# offloading modules import; and vLLM's own manager tests from its source release.
$(VLLM_STAMP): $(STAMP) tests/vllm/requirements.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps vllm==0.33.0
	$(BIN)/pip install -q --disable-pip-version-check -r tests/vllm/requirements.txt
	$(BIN)/python tests/vllm/fetch_upstream.py
	touch $(VLLM_STAMP)

# Tests that drive Debian packages: headless Chromium (the web page), Prometheus
# (a real scrape, promtool's lint), and podman with runc and mmdebstrap (the
# sidecar image, built from a Debian base and run: tests/container); installed
# unless already there. Where apt cannot run (no apt, not root) those tests skip
# and say why.
DEBS := chromium prometheus podman runc mmdebstrap ca-certificates
debs:
	-@(for command in chromium prometheus promtool podman runc mmdebstrap; do \
		command -v $$command >/dev/null || exit 1; done) || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBS) >/dev/null)

demo: $(STAMP) $(VENDOR_STAMP)
	$(BIN)/kvscope demo

test: $(VLLM_STAMP) debs $(VENDOR_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(VLLM_STAMP) $(VENDOR_STAMP)
	$(BIN)/python -m bench.policy_hit_ratio
	$(BIN)/python -m bench.hot_path
	$(BIN)/python -m bench.vllm_race
	$(BIN)/python -m bench.vllm_connector_hits
	$(BIN)/python -m bench.telemetry_overhead
	$(BIN)/python -m bench.transfer_cpu
	$(BIN)/python -m bench.sidecar_ingest
	$(BIN)/python -m bench.sidecar_latency
	$(BIN)/python -m bench.sidecar_sse_load
	$(BIN)/python -m bench.page_first_render
	$(BIN)/python -m bench.sidecar_insight
	$(BIN)/python -m bench.insight_accuracy
	$(BIN)/python -m bench.insight_overhead
	$(BIN)/python -m bench.insight_curve

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis node_modules $(VENDOR)
