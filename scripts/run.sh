#!/usr/bin/env bash
# The README's main-job command: set-up, build, then the main job: one `deltaserve generate` (embedded default
# model, or MODEL=DIR), then `deltaserve serve` started, swept by `deltaserve bench`
# (recipe embedded-smoke: concurrency 1, 2, 4) and stopped, with the report printed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target deltaserve
DS="$BUILD_DIR/src/deltaserve"
model_args=()
[ -n "${MODEL:-}" ] && model_args=(--model "$MODEL")
"$DS" generate "${model_args[@]}" --prompt "${PROMPT:-Hello, deltaserve}" --max-tokens "${MAX_TOKENS:-32}"
mkdir -p out
"$DS" sweep --recipe embedded-smoke --recipes recipes/recipes.json --out out/embedded-smoke
