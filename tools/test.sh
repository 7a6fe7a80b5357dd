#!/usr/bin/env bash
# README command 2: every test the project has. Run tools/setup.sh first.
#
#   Rust: every test, the agent ones included (DELTAMEM_REQUIRE_ASSETS=1
#   makes a missing asset a failure rather than a skip); the API docs
#   with warnings as errors
#   Python: the package's pytest suite in .venv/ (made by tools/setup.sh)
#   Browser: the explorer page in headless Chromium
set -euo pipefail
cd "$(dirname "$0")/.."

step() { echo "== test: $*" >&2; }

step "Rust (cargo test --release --features agent)"
DELTAMEM_REQUIRE_ASSETS=1 cargo test --release --features agent

# The scan's first passes differ by level (bfloat16 on AVX-512 BF16,
# 16-bit integers on AVX2): on an AVX-512 machine the differential tests
# above ran the bfloat16 one (or none), so they run again at the AVX2
# level, where the 16-bit pass runs (on an AVX2 machine they already did).
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
    step "Rust: first-pass differential tests at the AVX2 level"
    DELTAMEM_KERNEL=avx2 FUZZ_CASES=100 cargo test --release --test fuzz_rounded --test scan_modes
fi

# The API docs build without a broken or ambiguous link.
step "Rust docs (cargo doc, warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet

# --- Python package: pytest (python/tests) ------------------------------
# Rebuilds the package first (a no-op when nothing changed), so the tests
# never run against a stale native module.
step "Python (pytest python/tests)"
tools/setup-python.sh
DELTAMEM_REQUIRE_ASSETS=1 .venv/bin/python -m pytest -q python/tests
# -----------------------------------------------------------------------

# --- Server (docs/SERVER.md): MCP through the Python `mcp` client over
# stdio and Streamable HTTP, four stdio servers on one bank; then
# schemathesis against /openapi.json of a live server. (.ci/run adds kill -9
# cycles of the server: tools/server-kill9.sh.)
step "server: MCP clients (pytest tests/python_server)"
DELTAMEM_BIN=target/release/deltamem .venv/bin/python -m pytest -q tests/python_server
step "server: schemathesis against /openapi.json"
tools/server-schemathesis.sh
# -----------------------------------------------------------------------

# The explorer page in headless Chromium (tests/browser/explorer.test.js):
# each run builds a bank from the reference ScienceWorld trees, starts
# `deltamem serve` on a random port of 127.0.0.1 and stops it at the end.
# The binary is built with the agent feature so that "ask the memory" is
# also checked against `retrieve` (a server without it fails the test under
# DELTAMEM_REQUIRE_ASSETS=1). Screenshots of every page land in
# target/browser-artifacts/.
step "browser (explorer in headless Chromium)"
cargo build --release --quiet --features agent
(cd tests/browser && DELTAMEM_REQUIRE_ASSETS=1 npm test)
