#!/usr/bin/env bash
# The README's main-job command: set-up, build, then run deltaserve on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target deltaserve
exec "$BUILD_DIR"/src/deltaserve generate --prompt "${PROMPT:-Hello, deltaserve}" --max-tokens "${MAX_TOKENS:-32}" "$@"
