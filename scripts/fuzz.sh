#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang under AddressSanitizer +
# UndefinedBehaviorSanitizer and runs each for FUZZ_SECONDS (default 60) on a working copy of
# its committed seed corpus. New inputs stay in build/fuzz/corpus/; a crash leaves its input in
# build/fuzz/ and fails the script. Skipped when clang++ is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ not found (scripts/setup.sh installs it); skipped"
  exit 0
fi
CC=clang CXX=clang++ cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBEACONKV_WERROR=ON -DBEACONKV_SANITIZE=address,undefined -DBEACONKV_FUZZ=ON \
  -DBEACONKV_TESTS=OFF -DBEACONKV_BENCH=OFF -DBEACONKV_CUDA=OFF >/dev/null
cmake --build build/fuzz -j"$JOBS" --target block_manager_fuzz model_loader_fuzz policy_fuzz
for target in block_manager model_loader policy; do
  work=build/fuzz/corpus/$target
  mkdir -p "$work"
  echo "== fuzz $target for ${FUZZ_SECONDS}s =="
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "build/fuzz/tests/fuzz/${target}_fuzz" "$work" "tests/fuzz/corpus/$target" \
    -max_total_time="$FUZZ_SECONDS" -max_len=8192 -rss_limit_mb=2048 -timeout=20 \
    -print_final_stats=1 -artifact_prefix=build/fuzz/ 2>&1 | grep -E "^(#|stat::|INFO: (seed|A corpus))|Done|ERROR|SUMMARY" | tail -n 14
done
