#!/usr/bin/env bash
# Python test tools of the server (docs/SERVER.md) into the project
# virtualenv .venv/: the official MCP client (`mcp`) for
# tests/python_server/, schemathesis for the OpenAPI fuzz run, pytest.
# Idempotent; creates .venv if no earlier step did.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
    "mcp>=1.9,<2" "schemathesis>=4,<5" "pytest>=8"
