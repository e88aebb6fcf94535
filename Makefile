# maitred's two commands:
#   make run    build maitred into .venv and serve examples/hello.py on http://127.0.0.1:8000/
#   make test   build it, run the lint gates (make lint), then the Rust and the Python test suites
#   make wheel  a manylinux wheel in dist/, for installing maitred where there is no Rust (README, Installing)
#
# Rebuilds are incremental: cargo reuses target/ (or $CARGO_TARGET_DIR).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test install lint wheel

# Debian's python3 comes without venv; as root, install it rather than fail.
$(BIN)/python:
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { \
		echo "python3-venv is missing: installing it with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; }
	$(PYTHON) -m venv $(VENV)

# The build backend, for --no-build-isolation (the same requirement as pyproject.toml's
# [build-system]); redone when pyproject.toml changes.
$(VENV)/.build-tools: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip "maturin>=1.9,<2"
	touch $@

# maturin's build backend starts the `maturin` executable by name, so the build runs with the
# venv's bin first on PATH (the venv is not activated, and nothing outside it may be used).
install: $(VENV)/.build-tools
	@echo "Building maitred into $(VENV) (the first build takes a few minutes)"
	PATH="$$PWD/$(BIN):$$PATH" $(BIN)/pip install --quiet --no-build-isolation ".[test,reload]"

# The same release build as `make install` (cargo reuses it when it is up to date: the same
# interpreter, so the same pyo3 configuration), packed by maturin, which reads the glibc symbol
# versions the library needs and tags the wheel with the manylinux policy they allow, as
# auditwheel would.
wheel: $(VENV)/.build-tools
	rm -f dist/maitred-*.whl
	PATH="$$PWD/$(BIN):$$PATH" $(BIN)/maturin build --release --interpreter $(BIN)/python3 --out dist

run: install
	@echo "Serving examples/hello.py at http://127.0.0.1:8000/ (Ctrl-C stops it)"
	$(BIN)/maitred --chdir examples --bind 127.0.0.1:8000 hello:app

# The lint gates: rustfmt, clippy with every warning an error, ruff's checks and its format.
# rustup's minimal profile leaves out clippy and rustfmt; add them when they are missing.
lint: install
	@cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The conformance tests' corpora: tests/corpora.py finds each (../shared, or gunicorn's sdist
# fetched into .cache/) and says which it skips; the Rust tests learn where from the environment.
# TESTS picks pytest's files (all of tests/ by default), e.g. TESTS=tests/test_wheel.py.
TESTS ?= tests
test: install lint
	eval "$$($(BIN)/python tests/corpora.py)" && cargo test --workspace
	cargo build --release -p maitred-stub
	$(BIN)/python -m pytest $(TESTS) -q -rs

# The benchmark against the peers (bench/README.md): every scenario, or some with S=S1,T1.
# Results go to bench/results/; it takes about 30 minutes (bench/README.md).
.PHONY: bench
bench: install
	$(PYTHON) bench/run.py $(if $(S),--scenarios $(S))
