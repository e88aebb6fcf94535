# maitred's two commands:
#   make run    build maitred into .venv and serve examples/hello.py on http://127.0.0.1:8000/
#   make test   build it, run the lint gates (make lint), then the Rust and the Python test suites
#   make wheel  a manylinux2014 wheel in dist/, for installing maitred where there is no Rust (README, Installing)
#   make wheel-aarch64  the same wheel for aarch64 Linux; make check-aarch64 checks it under
#               qemu-user, with Debian's arm64 python3 (README, Installing)
#   make test-pythons  the worker-side tests on every other CPython the machine has, 3.10 on, with that wheel
#
# Rebuilds are incremental: cargo reuses target/ (or $CARGO_TARGET_DIR).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The pip every venv of the project runs: .venv, and tests/pythons.py's.
PIP_PIN := pip==26.3

.PHONY: run test install lint wheel wheel-aarch64 check-aarch64 test-pythons

# Debian's python3 comes without venv; as root, install it rather than fail.
$(BIN)/python:
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { \
		echo "python3-venv is missing: installing it with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; }
	$(PYTHON) -m venv $(VENV)

# The build backend, for --no-build-isolation: pyproject.toml's [build-system] requirement,
# pinned here within its range so that every build is made by the same maturin; redone when
# pyproject.toml changes.
$(VENV)/.build-tools: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet "$(PIP_PIN)" "maturin==1.16.0"
	touch $@

# maitred itself, and nothing more: it has no run-time dependency, so `make run` waits only for
# the build. maturin's build backend starts the `maturin` executable by name, so the build runs
# with the venv's bin first on PATH (the venv is not activated, and nothing outside it may be
# used). --no-build-isolation applies to maitred alone: it builds with the venv's maturin and
# cargo's incremental target directory.
install: $(VENV)/.build-tools
	@echo "Building maitred into $(VENV) (the first build takes a few minutes)"
	PATH="$$PWD/$(BIN):$$PATH" $(BIN)/pip install --quiet --no-build-isolation .

# What the tests and the lint gates use, pinned in tests/requirements.txt, and --reload's
# watchfiles (the [reload] extra, pinned there too). pip builds a package served only as a source
# distribution in an isolated environment of its own; redone when the pins change.
$(VENV)/.test-tools: tests/requirements.txt | $(BIN)/python
	$(BIN)/pip install --quiet --requirement tests/requirements.txt
	touch $@

# A wheel for machines without Rust: the release build, linked by zig (ziglang from PyPI, pinned)
# against glibc 2.17's symbols, so that maturin can tag it manylinux2014 and it installs on
# every Linux of the last ten years (Debian 9, Ubuntu 18.04, RHEL 7, Amazon Linux 2 and later).
# It shares target/ with `make install`, whose host-linked build cargo redoes where the linker
# differs.
$(VENV)/.wheel-tools: | $(BIN)/python
	$(BIN)/pip install --quiet "ziglang==0.17.0"
	touch $@

# Each wheel replaces only its own machine's: dist/ may hold the aarch64 wheel beside it.
wheel: $(VENV)/.build-tools $(VENV)/.wheel-tools
	rm -f dist/maitred-*_$(shell uname -m).whl
	PATH="$$PWD/$(BIN):$$PATH" $(BIN)/maturin build --release --zig --compatibility manylinux2014 \
		--interpreter $(BIN)/python3 --out dist

# The same wheel for aarch64 Linux (AWS Graviton, Ampere, Docker on Apple silicon): zig links it
# for aarch64 against glibc 2.17's symbols as well, so it needs only rustup's standard library
# for that target, added when it is missing. It builds in aarch64-unknown-linux-gnu/ of the target
# directory, apart from the x86_64 build.
wheel-aarch64: $(VENV)/.build-tools $(VENV)/.wheel-tools
	@rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu
	rm -f dist/maitred-*_aarch64.whl
	PATH="$$PWD/$(BIN):$$PATH" $(BIN)/maturin build --release --zig --compatibility manylinux2014 \
		--target aarch64-unknown-linux-gnu --interpreter $(BIN)/python3 --out dist

# A machine without an aarch64 processor can still run that wheel: tests/aarch64_wheel.py has
# auditwheel read its symbols, then installs it for Debian's arm64 python3 (unpacked into .cache/)
# and serves one request with it under qemu-user. It prints one line; it skips, saying why,
# without qemu-user or apt.
check-aarch64: wheel-aarch64 $(VENV)/.test-tools
	$(BIN)/python tests/aarch64_wheel.py

run: install
	@echo "Serving examples/hello.py at http://127.0.0.1:8000/ (Ctrl-C stops it)"
	$(BIN)/maitred --chdir examples --bind 127.0.0.1:8000 hello:app

# The lint gates: rustfmt, clippy with every warning an error, ruff's checks and its format.
# rustup's minimal profile leaves out clippy and rustfmt; add them when they are missing.
lint: install $(VENV)/.test-tools
	@cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The conformance tests' corpora: tests/corpora.py finds each (../shared, or gunicorn's sdist
# fetched into .cache/); the Rust tests learn where from the environment, and fail without it, so
# it also names in CARGO_TEST_SKIPS the ones cargo is to leave out, saying on one line each why.
# TESTS picks pytest's files (all of tests/ by default), e.g. TESTS=tests/test_wheel.py.
# LINT= leaves the lint gates out: .ci/run's first run does, as its second, in a fresh clone of the
# same tree, runs them.
TESTS ?= tests
LINT ?= lint
test: install $(VENV)/.test-tools $(LINT)
	eval "$$($(BIN)/python tests/corpora.py)" && cargo test --workspace -- $$CARGO_TEST_SKIPS
	cargo build --release -p maitred-stub
	$(BIN)/python -m pytest $(TESTS) -q -rs

# The benchmark against the peers (bench/README.md): every scenario, or some with S=S1,T1.
# Results go to bench/results/; it takes about 30 minutes (bench/README.md).
.PHONY: bench
bench: install
	$(PYTHON) bench/run.py $(if $(S),--scenarios $(S))

# The worker-side tests on each other CPython from 3.10 on, in venvs of .venv-pythons/ with the
# wheel installed (tests/pythons.py): the abi3 wheel's claim, tested where the machine has them.
test-pythons: wheel
	PIP_PIN="$(PIP_PIN)" $(BIN)/python tests/pythons.py
