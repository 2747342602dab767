#!/usr/bin/env bash
# Device checks, prepared for a lent GPU machine (docs/gpu.md): build with CUDA, run the GPU
# tests, the device benchmark, then a short time-boxed compute-sanitizer pass. One call does
# all of it in under 8 minutes on an H200. Writes into $OUT (default build/device_out):
#   gpu_summary.txt  what ran and what it printed, in short
#   gpu_tests.log    the GoogleTest and compute-sanitizer output
#   gpu_results.json the benchmark figures (kernels/gpu_bench.cu)
#   build.log        configure and build output
# Without a GPU (no nvidia-smi, or it lists no device) it builds and stops with a message.
# Environment: OUT, BUILD_DIR (default build/device), CUDA_ARCHS (default 90), JOBS, TEST_TIMEOUT,
# BENCH_TIMEOUT, SANITIZE_UNTIL, SANITIZE_TIMEOUT (seconds),
# PREBUILT (default .gpu_prebuilt, or PREBUILT.tar.xz, unpacked first): the GPU test binaries and
# the benchmark packed by `--pack DIR` on a machine with the C++ dependencies; when they start
# here nothing is built (see docs/gpu.md).
set -uo pipefail

# --pack DIR: copy the built GPU test binaries and the shared libraries they need (beyond
# the C and C++ runtimes) into DIR, to be carried to a machine without absl/GTest/CBLAS.
if [ "${1:-}" = "--pack" ]; then
  dir=${2:?usage: run_device_checks.sh --pack DIR}
  build=${BUILD_DIR:-build/gpu}
  mkdir -p "$dir/lib"
  cp "$build/kernels/beaconkv_gpu_bench" "$dir/"
  for t in "$build"/kernels/gpu_*_test; do
    cp "$t" "$dir/"
    ldd "$t" | awk '/=> \// {print $3}' |
      grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so' |
      xargs -r -I{} cp -L {} "$dir/lib/"
  done
  strip "$dir"/gpu_*_test "$dir/beaconkv_gpu_bench" 2>/dev/null || true
  # One compressed file travels: OpenBLAS alone is ~36 MB of the 64 MiB a device call carries.
  tar -cJf "$dir.tar.xz" -C "$(dirname "$dir")" "$(basename "$dir")"
  du -sh "$dir" "$dir.tar.xz"
  exit 0
fi

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/build/device_out}
BUILD=${BUILD_DIR:-$ROOT/build/device}
ARCHS=${CUDA_ARCHS:-90}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT" "$BUILD"
SUMMARY=$OUT/gpu_summary.txt
TESTLOG=$OUT/gpu_tests.log
BUILDLOG=$OUT/build.log
: >"$SUMMARY"
: >"$TESTLOG"
: >"$BUILDLOG"
log() { echo "$*" | tee -a "$SUMMARY"; }
status=0

log "== BeaconKV device checks, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  have_gpu=1
  nvidia-smi -L | tee -a "$SUMMARY"
else
  log "nvidia-smi is missing or lists no GPU: building only; the GPU tests and the benchmark are skipped."
fi
command -v nvcc >/dev/null 2>&1 || { log "nvcc not found: cannot build the CUDA kernels."; exit 1; }

log "nvcc: $(nvcc --version | tail -n 1)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
  2>/dev/null | tee -a "$SUMMARY"

# 0. Prebuilt binaries (`--pack`): when every test and the benchmark are there and start on
#    this machine, nothing is built, which saves the lent machine's minutes.
prebuilt=${PREBUILT:-$ROOT/.gpu_prebuilt}
if [ ! -d "$prebuilt" ] && [ -f "$prebuilt.tar.xz" ]; then
  tar -xJf "$prebuilt.tar.xz" -C "$(dirname "$prebuilt")" && log "unpacked $prebuilt.tar.xz"
fi
tests=()
bench=""
if [ -x "$prebuilt/beaconkv_gpu_bench" ] && ls "$prebuilt"/gpu_*_test >/dev/null 2>&1; then
  export LD_LIBRARY_PATH="$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  starts=1
  for t in "$prebuilt"/gpu_*_test; do
    "$t" --gtest_list_tests >/dev/null 2>>"$BUILDLOG" || { starts=0; log "prebuilt $t does not start here"; }
  done
  if [ "$starts" = 1 ]; then
    tests=("$prebuilt"/gpu_*_test)
    bench=$prebuilt/beaconkv_gpu_bench
    log "build: none, running the prebuilt binaries in $prebuilt (${#tests[@]} tests + benchmark)"
  fi
fi

# 1. Build. The full CMake build needs absl, GoogleTest and a CBLAS (the CPU twins use core/);
#    without them only the benchmark is built, straight from the .cu files with nvcc.
if [ -z "$bench" ]; then
generator=()
if [ ! -f "$BUILD/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi
if cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBEACONKV_CUDA=ON \
     -DBEACONKV_TESTS=ON -DBEACONKV_BENCH=ON -DBEACONKV_WERROR=ON \
     -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" >>"$BUILDLOG" 2>&1; then
  targets=(beaconkv_gpu_bench)
  for src in "$ROOT"/tests/gpu/*_test.cc; do
    name=gpu_$(basename "$src" .cc)
    targets+=("$name")
    tests+=("$BUILD/kernels/$name")
  done
  if cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" >>"$BUILDLOG" 2>&1; then
    log "build: CMake, CUDA architectures $ARCHS: ${targets[*]}"
    bench=$BUILD/kernels/beaconkv_gpu_bench
  else
    log "build FAILED (see build.log):"
    tail -n 30 "$BUILDLOG" | tee -a "$SUMMARY"
    exit 1
  fi
else
  log "CMake configure failed (absl, GoogleTest or CBLAS missing?): GPU tests NOT built; see build.log."
  tail -n 5 "$BUILDLOG" | tee -a "$SUMMARY"
  arch_flags=()
  for a in ${ARCHS//;/ }; do arch_flags+=(-gencode "arch=compute_$a,code=sm_$a"); done
  # One nvcc per file, in parallel, then one link.
  objs=()
  pids=()
  for f in gpu_bench cache_ops compaction_moves paged_attention paged_attention_gqa paged_scores \
           rope_rotate segmented_topk; do
    (cd "$ROOT" && nvcc -std=c++17 -O3 "${arch_flags[@]}" -I. -c "kernels/$f.cu" \
       -o "$BUILD/$f.o") >>"$BUILDLOG" 2>&1 &
    pids+=($!)
    objs+=("$BUILD/$f.o")
  done
  compiled=1
  for p in "${pids[@]}"; do wait "$p" || compiled=0; done
  if [ "$compiled" = 1 ] && nvcc "${arch_flags[@]}" -o "$BUILD/beaconkv_gpu_bench" "${objs[@]}" \
       >>"$BUILDLOG" 2>&1; then
    log "build: benchmark only, with nvcc directly"
    bench=$BUILD/beaconkv_gpu_bench
  else
    log "benchmark build FAILED (see build.log)"
    exit 1
  fi
  if ls "$prebuilt"/gpu_*_test >/dev/null 2>&1; then
    export LD_LIBRARY_PATH="$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    tests=("$prebuilt"/gpu_*_test)
    log "tests: running the prebuilt binaries in $prebuilt"
  fi
fi
fi  # build

if [ "$have_gpu" = 0 ]; then
  log "no GPU: stopping after the build."
  exit 0
fi

# 2. GPU tests, all binaries at once (their CPU twins use the machine's cores; the GPU runs
#    their small launches side by side), each into its own log, gathered into gpu_tests.log.
LOGDIR=$BUILD/test_logs
rm -rf "$LOGDIR"
mkdir -p "$LOGDIR"
if [ "${#tests[@]}" -gt 0 ]; then
  passed=0
  failed=0
  pids=()
  for t in "${tests[@]}"; do
    (t0=$SECONDS
     timeout "${TEST_TIMEOUT:-150}" "$t" --gtest_brief=1 >"$LOGDIR/$(basename "$t").log" 2>&1
     echo "rc=$? seconds=$((SECONDS - t0))" >"$LOGDIR/$(basename "$t").rc") &
    pids+=($!)
  done
  wait "${pids[@]}"
  for t in "${tests[@]}"; do
    name=$(basename "$t")
    { echo "== $name"; cat "$LOGDIR/$name.log"; } >>"$TESTLOG"
    read -r rc secs <"$LOGDIR/$name.rc"
    if [ "$rc" = "rc=0" ]; then
      passed=$((passed + 1))
      log "test PASS $name ($(tail -n 1 "$LOGDIR/$name.log"), ${secs#seconds=} s)"
    else
      failed=$((failed + 1))
      status=1
      log "test FAIL $name ($rc after ${secs#seconds=} s; see gpu_tests.log)"
    fi
  done
  log "tests: $passed binaries passed, $failed failed"
  grep -E "^\[  FAILED  \]" "$TESTLOG" | head -n 40 | tee -a "$SUMMARY"
else
  log "tests: not built (see above)"
fi

# 3. Benchmark.
if timeout "${BENCH_TIMEOUT:-300}" "$bench" --json "$OUT/gpu_results.json" 2>&1 | tee -a "$SUMMARY"; then
  log "benchmark: done, figures in gpu_results.json"
else
  status=1
  log "benchmark FAILED"
fi

# 4. A short compute-sanitizer pass over a few parameter sets: memcheck on the kernels,
#    racecheck on those that share memory between threads. All runs at once, each time-boxed
#    (SANITIZE_TIMEOUT, default 150 s); none starts once the script has used SANITIZE_UNTIL
#    seconds (default 400).
until_s=${SANITIZE_UNTIL:-400}
if [ "${#tests[@]}" -gt 0 ] && command -v compute-sanitizer >/dev/null 2>&1; then
  test_dir=$(dirname "${tests[0]}")
  san_runs=()
  # GoogleTest filters know only * and ?; instance numbers follow the Combine() order.
  san() {  # tool binary filter
    if [ "$SECONDS" -ge "$until_s" ]; then
      log "sanitizer $1 skipped (time box): $2 ($3)"
      return
    fi
    local i=${#san_runs[@]}
    san_runs+=("$1|$2|$3")
    (timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool "$1" --error-exitcode 9 \
       "$test_dir/$2" --gtest_brief=1 --gtest_filter="$3" >"$LOGDIR/san$i.log" 2>&1
     echo $? >"$LOGDIR/san$i.rc") &
  }
  san memcheck gpu_segmented_topk_test 'Shapes/SegmentedTopKGpuTest.*/4?:Shapes/SegmentedTopKGpuTest.*/8?:SegmentedTopKGpuLongTest.*'
  san memcheck gpu_rope_append_test '*'
  san memcheck gpu_compaction_moves_test 'Shapes/CompactionMovesGpuTest.*/4'
  san racecheck gpu_compaction_moves_test 'Shapes/CompactionMovesGpuTest.*/4'
  san memcheck gpu_paged_attention_gqa_test 'Shapes/PagedAttentionGqaGpuTest.*/1?'
  san memcheck gpu_paged_scores_test 'Shapes/PagedScoresGpuTest.*/1?'
  san racecheck gpu_segmented_topk_test 'Shapes/SegmentedTopKGpuTest.*/40:Shapes/SegmentedTopKGpuTest.*/41'
  # 2026-12-04: the radix select (instances ending in 2, 5, 8: the third algorithm).
  san racecheck gpu_segmented_topk_test 'Shapes/SegmentedTopKGpuTest.*/68:Shapes/SegmentedTopKGpuTest.*/89'
  san racecheck gpu_paged_attention_gqa_test 'Shapes/PagedAttentionGqaGpuTest.*/10:Shapes/PagedAttentionGqaGpuTest.*/13'
  san racecheck gpu_paged_scores_test 'Shapes/PagedScoresGpuTest.*/1'
  # 2026-12-03: max-logit GQA with excluded keys (Excluded/10: head_dim 32, GQA 8), 16-bit keys,
  # R-KV's redundancy.
  san memcheck gpu_paged_scores_test 'Excluded/PagedScoresGpuTest.*/1?:Storage/PagedScoresGpuTest.*/1'
  san racecheck gpu_paged_scores_test 'Excluded/PagedScoresGpuTest.*/10'
  san memcheck gpu_redundancy_test 'Shapes/RedundancyGpuTest.*/0:Shapes/RedundancyGpuTest.*/5'
  san racecheck gpu_redundancy_test 'Shapes/RedundancyGpuTest.*/0'
  san memcheck gpu_fps_test '*'
  san racecheck gpu_fps_test '*'
  san memcheck gpu_gpu_scorer_test '*'
  san memcheck gpu_cuda_kv_store_test '*'
  wait
  for i in "${!san_runs[@]}"; do
    IFS='|' read -r tool bin filter <<<"${san_runs[$i]}"
    { echo "== sanitizer $tool $bin ($filter)"; cat "$LOGDIR/san$i.log"; } >>"$TESTLOG"
    case $(cat "$LOGDIR/san$i.rc") in
      0) log "sanitizer $tool clean: $bin ($filter)" ;;
      124) log "sanitizer $tool timed out (no verdict): $bin ($filter)" ;;
      *)
        status=1
        log "sanitizer $tool REPORTED ERRORS or failed: $bin ($filter) (see gpu_tests.log)"
        ;;
    esac
  done
else
  log "sanitizer pass skipped (no test binaries or no compute-sanitizer)"
fi
# 5. Optional (NCU_PROFILE=1): Nsight Compute's speed-of-light, occupancy and launch figures
#    for the benchmark's scoring, top-k and GQA attention launches, as CSV in ncu.csv.
if [ "${NCU_PROFILE:-0}" = 1 ] && [ -n "$bench" ] && command -v ncu >/dev/null 2>&1; then
  if timeout "${NCU_TIMEOUT:-150}" ncu --clock-control none --csv --page details \
       --section SpeedOfLight --section Occupancy --section LaunchStats \
       -k 'regex:PagedScores|GqaDecode|BlockTopK' --launch-count "${NCU_LAUNCHES:-120}" \
       "$bench" >"$OUT/ncu.csv" 2>"$BUILD/ncu.err"; then
    log "ncu: profile in ncu.csv ($(wc -l <"$OUT/ncu.csv") lines)"
  else
    log "ncu: did not finish (timeout or error): $(tail -n 2 "$BUILD/ncu.err" | tr '\n' ' ')"
  fi
fi
# 6. Optional (NCU_DEEP=1): Nsight Compute's full set (stall reasons, pipes, memory tables) for
#    one scoring launch and one bf16 GQA attention launch at batch 256 (launch 108 of the
#    attention part: 30 GQA launches per batch size, the bf16 one after three others).
if [ "${NCU_DEEP:-0}" = 1 ] && [ -n "$bench" ] && command -v ncu >/dev/null 2>&1; then
  deep() {  # name part kernel skip
    if timeout "${NCU_TIMEOUT:-150}" ncu --clock-control none --set full -k "regex:$3" \
         --launch-skip "$4" --launch-count 1 "$bench" --only "$2" >"$OUT/ncu_$1.txt" \
         2>"$BUILD/ncu_$1.err"; then
      log "ncu --set full: $3 ($2, launch $4) in ncu_$1.txt"
    else
      log "ncu --set full: $3 did not finish: $(tail -n 2 "$BUILD/ncu_$1.err" | tr '\n' ' ')"
    fi
  }
  deep scores compression PagedScoresKernel 0
  deep gqa_bf16 attention GqaDecodeKernel 108
fi
log "== exit status $status, ${SECONDS} s"
exit $status
