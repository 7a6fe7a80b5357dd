#!/usr/bin/env bash
# Durable single-node inserts (sync always, dim 768) against `deltamem
# serve` on loopback, driven by wrk (Debian: apt-get install wrk) from a
# separate process: 1, 8 and 32 connections, 4 s each, on a fresh empty
# bank. Prints the rate, wrk's mean latency, and the CPU per insert of the
# server process and of wrk, with the load average. A cross-check of
# `cargo run --release --example server_load` (whose in-process ureq
# clients cost more CPU than wrk does); not run by CI.
#
#   tools/server-inserts-wrk.sh [BINARY] [PORT]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/deltamem}
PORT=${2:-7979}
[ "$#" -ge 1 ] || cargo build --release --quiet
command -v wrk > /dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }
DIR=$(mktemp -d)
SERVER=
# The server checkpoints on SIGTERM: wait for it before removing the bank.
trap '[ -n "$SERVER" ] && kill "$SERVER" 2> /dev/null && wait "$SERVER" 2> /dev/null; rm -rf "$DIR"' EXIT
python3 - "$DIR" <<'PY'
import json, random, sys
random.seed(1)
v = [random.random() - 0.5 for _ in range(768)]
norm = sum(x * x for x in v) ** 0.5
body = {"tree": "task", "attach": "root", "label": "SUCCESS", "scenario": "wrk",
        "payload": {}, "embedding": [x / norm for x in v]}
open(sys.argv[1] + "/body.json", "w").write(json.dumps(body, separators=(",", ":")))
open(sys.argv[1] + "/post.lua", "w").write(
    'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
    f'local f = io.open("{sys.argv[1]}/body.json", "r")\nwrk.body = f:read("*a")\nf:close()\n')
PY
"$BIN" init --dim 768 "$DIR/bank" > /dev/null
"$BIN" serve "$DIR/bank" --listen "127.0.0.1:$PORT" --sync always --quiet > "$DIR/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/healthz" > /dev/null 2>&1 && break; sleep 0.1; done
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
for clients in 1 8 32; do
    before=$(ticks "$SERVER")
    out=$({ /usr/bin/time -f "WRKCPU %U %S" wrk -t1 -c"$clients" -d4s -s "$DIR/post.lua" \
        "http://127.0.0.1:$PORT/v1/nodes"; } 2>&1)
    after=$(ticks "$SERVER")
    echo "$out" | awk -v c="$clients" -v server=$((after - before)) -v hz="$hz" \
        -v load="$(cut -d' ' -f1 /proc/loadavg)" '
        /requests in/ { n = $1 }
        /Requests\/sec/ { rate = $2 }
        /Latency/ { lat = $2 }
        /WRKCPU/ { wrk = $2 + $3 }
        END { printf "insert %2d clients (wrk): %8.1f w/s  mean %s  CPU/insert server %.0f us + wrk %.0f us; load %s\n",
              c, rate, lat, server / hz / n * 1e6, wrk / n * 1e6, load }'
done
