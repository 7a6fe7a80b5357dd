#!/usr/bin/env bash
# deltamem's exact scan side by side with faiss IndexFlatIP, numpy and
# usearch exact, single-threaded, on the same 1M x 768 f32 data.
#
#   tools/bench-vs-peers.sh [--rows N] [--precisions f32,f16,int8] [--rounds R] ...
#
# Creates a venv under target/bench-venv (numpy, faiss-cpu, usearch from
# pip; a package that does not install is skipped and reported), builds
# examples/bench_scan.rs in release mode, and runs tools/bench-vs-peers.py
# (see its --help). Data and banks are cached under target/bench-peers/
# (about 3.1 GB for the matrix plus 3.3 GB per f32 bank at 1M x 768);
# delete that directory to reclaim the space.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/bench-venv
PACKAGES=("numpy==2.4.6" "faiss-cpu==1.15.1" "usearch==2.26.6")
if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi
for pkg in "${PACKAGES[@]}"; do
    name="${pkg%%==*}"
    if ! "$VENV/bin/python" -m pip show -q "$name" >/dev/null 2>&1; then
        "$VENV/bin/python" -m pip install -q "$pkg" \
            || echo "bench-vs-peers: $pkg does not install here; continuing without it" >&2
    fi
done
cargo build --release --example bench_scan
HARNESS="${CARGO_TARGET_DIR:-target}/release/examples/bench_scan"
exec "$VENV/bin/python" tools/bench-vs-peers.py --harness "$HARNESS" "$@"
