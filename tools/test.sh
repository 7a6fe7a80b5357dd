#!/usr/bin/env bash
# README command 2: every test the project has. Run tools/setup.sh first.
#
#   Rust: every test, the agent ones included (DELTAMEM_REQUIRE_ASSETS=1
#   makes a missing asset a failure rather than a skip)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { echo "== test: $*" >&2; }

step "Rust (cargo test --release --features agent)"
DELTAMEM_REQUIRE_ASSETS=1 cargo test --release --features agent
