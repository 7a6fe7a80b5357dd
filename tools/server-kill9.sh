#!/usr/bin/env bash
# kill -9 of `deltamem serve` under durable write load, with a ledger
# (tools/server_kill9.py; 20 cycles by default, .ci/run runs a few).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
exec python3 tools/server_kill9.py "$@"
