#!/usr/bin/env bash
# The Python package (python/, docs/PYTHON.md) built and installed into the
# project virtualenv .venv/ (gitignored), with what its tests and
# benchmark need: maturin, numpy, pytest. Idempotent: a second run only
# rebuilds what changed.
#
#   PYTHON=python3.12 tools/setup-python.sh   # another interpreter (>= 3.9)
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
venv=.venv
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
# Only what is missing is fetched; pip's own resolver makes this a no-op
# when everything is present.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "maturin>=1.9,<2" "numpy>=1.21" "pytest>=7"
# Editable install of the release build: python/deltamem is imported from
# the source tree, the native module is built into it.
(cd python && VIRTUAL_ENV="$PWD/../$venv" "../$venv/bin/maturin" develop --release --quiet)
"$venv/bin/python" -c "import deltamem; print('deltamem', deltamem.__version__, 'installed in $venv')"
