#!/usr/bin/env bash
# schemathesis (PyPI, installed by tools/setup-server-python.sh) against
# /openapi.json of a live `deltamem serve` on loopback: no 5xx, every
# response matches the documented schema. Bounded by --max-examples.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
server_pid=""
cleanup() {
    [ -n "$server_pid" ] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" || true
    rm -rf "$work"
}
trap cleanup EXIT
target/release/deltamem init "$work/bank" --dim 4 --quiet
target/release/deltamem serve "$work/bank" --listen 127.0.0.1:0 --threads 2 2> "$work/log" &
server_pid=$!
for _ in $(seq 100); do
    grep -q "http://" "$work/log" && break
    sleep 0.1
done
base=$(grep -o 'http://[0-9.:]*' "$work/log" | head -1)
[ -n "$base" ] || { cat "$work/log" >&2; exit 1; }
# A few nodes so node routes have something to find.
for i in 0 1 2; do
    curl -sf -X POST "$base/v1/nodes" -d "{\"tree\":\"task\",\"attach\":\"auto\",\"label\":\"SUCCESS\",\"scenario\":\"n$i\",\"payload\":{},\"embedding\":[1,$i,0,0]}" > /dev/null
done
.venv/bin/schemathesis run "$base/openapi.json" \
    --checks not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance \
    --max-examples "${SCHEMATHESIS_EXAMPLES:-30}" --workers 1
