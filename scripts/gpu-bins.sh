#!/usr/bin/env bash
# Binaries built here, carried to the GPU machine, so a device call skips its ~60-90 s build (a fresh machine
# per call, 30 minutes of device time a session). deps.md: a binary built on the Debian 12 development machine
# with nvcc (cudart static, cuBLASLt dynamic) runs there unchanged; deltaserve's server libraries (cpp-httplib,
# brotli) are not in that image, so they travel too.
#   here:  scripts/gpu-bins.sh pack [BUILD_DIR]       -> gpu-bins/bins.tar.xz (git-ignored; name it in `carry`)
#   there: scripts/gpu-bins.sh unpack [BUILD_DIR]     -> /tmp/ds-build-gpu by default, the same layout as a
#          build (src/, tests/, bench/, tools/ktrace/) plus lib/; exits non-zero if the binaries do not start
#          there, so a caller can fall back to building: `scripts/gpu-bins.sh unpack || ninja -C ...`.
#   here:  scripts/gpu-bins.sh pack-extra NAME BINARY -> gpu-bins/extra-NAME.xz: one more binary for the same
#          call, e.g. deltaserve built from another commit for an A/B (`gpu-ab.sh 'base:DS_BIN=...extra/base'`);
#          unpack puts it at BUILD_DIR/extra/NAME. Pack the main set again (or delete the extras) to drop them.
#   Runs need LD_LIBRARY_PATH=$BUILD_DIR/lib (gpu-check.sh sets it with PREBUILT=1). GPU_BINS_ARCHIVE overrides
#   the archive's path (tests).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
archive=${GPU_BINS_ARCHIVE:-gpu-bins/bins.tar.xz}
dir=$(dirname "$archive")
# The device call carries at most 64 MiB with the working tree: the archive and its extras together.
check_size() {
  local total=0 f
  for f in "$dir"/bins.tar.xz "$dir"/extra-*.xz; do [ -f "$f" ] && total=$((total + $(stat -c %s "$f"))); done
  [ "$total" -lt $((56 * 1048576)) ] || { echo "gpu-bins: $((total / 1048576)) MiB in $dir: too large to carry" >&2; exit 1; }
}
case "$mode" in
  pack-extra)
    name=${2:-}
    bin=${3:-}
    [[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]] && [ -f "$bin" ] || {
      echo "usage: scripts/gpu-bins.sh pack-extra NAME BINARY (NAME: letters, digits, . _ -)" >&2
      exit 2
    }
    mkdir -p "$dir"
    tmp=$(mktemp)
    trap 'rm -f "$tmp"' EXIT
    cp "$bin" "$tmp"
    strip --strip-unneeded "$tmp" 2>/dev/null || true
    xz -6 -T2 -c "$tmp" > "$dir/extra-$name.xz"
    echo "gpu-bins: $dir/extra-$name.xz, $(( $(stat -c %s "$dir/extra-$name.xz") / 1048576 )) MiB"
    check_size
    ;;
  pack)
    build=${2:-build}
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    files=(src/deltaserve tests/core_tests tests/kernels_tests tests/runtime_tests tools/ktrace/libds_ktrace.so)
    for b in "$build"/bench/*_bench; do files+=("bench/$(basename "$b")"); done
    for f in "${files[@]}"; do
      [ -f "$build/$f" ] || { echo "gpu-bins: $build/$f is missing: build it first (ninja -C $build)" >&2; exit 1; }
      mkdir -p "$stage/$(dirname "$f")"
      cp "$build/$f" "$stage/$f"
      strip --strip-unneeded "$stage/$f" 2>/dev/null || true
    done
    # Shared libraries the GPU image lacks (deps.md), as resolved here.
    mkdir -p "$stage/lib"
    { ldd "$build/src/deltaserve" 2>/dev/null || true; } | awk '/libcpp-httplib|libbrotli/ {print $3}' | while read -r so; do
      cp -L "$so" "$stage/lib/"
    done
    {
      echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- src tests bench tools CMakeLists.txt || echo ' + uncommitted changes')"
      echo "built $(date -u +%FT%TZ) on $(uname -n)"
    } > "$stage/STAMP"
    mkdir -p "$(dirname "$archive")"
    # xz -9: a 64 MiB window spans whole binaries, so the kernels every binary links are stored about once (-6's
    # 8 MiB window made the set 61 MiB, past the carry limit; -9 22 MiB, ~80 s on two cores).
    tar -C "$stage" -cf - . | xz -9 -T2 > "$archive"
    size=$(stat -c %s "$archive")
    echo "gpu-bins: $archive, $((size / 1048576)) MiB ($(head -1 "$stage/STAMP"))"
    rm -f "$dir"/extra-*.xz  # extras belong to the set they were packed with
    check_size
    ;;
  unpack)
    build=${2:-/tmp/ds-build-gpu}
    [ -f "$archive" ] || { echo "gpu-bins: no $archive (carry gpu-bins)" >&2; exit 1; }
    mkdir -p "$build"
    xz -dc "$archive" | tar -C "$build" -xf -
    cat "$build/STAMP"
    if ! LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$build/src/deltaserve" --help > /dev/null 2>&1 ||
       ! "$build/tests/kernels_tests" --gtest_list_tests > /dev/null 2>&1; then
      echo "gpu-bins: the carried binaries do not start on this machine" >&2
      rm -rf "$build/src" "$build/tests" "$build/bench" "$build/tools" "$build/lib" "$build/STAMP"
      exit 1
    fi
    for x in "$dir"/extra-*.xz; do
      [ -f "$x" ] || continue
      name=$(basename "$x" .xz)
      name=${name#extra-}
      mkdir -p "$build/extra"
      xz -dc "$x" > "$build/extra/$name"
      chmod +x "$build/extra/$name"
      echo "gpu-bins: extra binary $build/extra/$name"
    done
    echo "gpu-bins: carried binaries in $build"
    ;;
  *)
    echo "usage: scripts/gpu-bins.sh pack [BUILD_DIR] | pack-extra NAME BINARY | unpack [BUILD_DIR]" >&2
    exit 2
    ;;
esac
