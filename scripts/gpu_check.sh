#!/usr/bin/env bash
# The one command for the GPU machine: build, (tune), test, benchmark; a short summary last.
# Environment: BUILD=0 (no build: the extension module already in flash_attn_cuda/, e.g. one built on
# the CPU machine for the GPU machine's torch and Python and carried; `python -m flash_attn_cuda`
# checks it), FLASH_ATTN_CUDA_ARCHS (default 90), FLASH_ATTN_HDIMS, FLASH_ATTN_DTYPES, MAX_JOBS (16),
# TESTS=1|0, PYTEST_ARGS (added to `pytest tests`, split on spaces, so no quoted -k expressions:
# one word such as "-k fp16" (the dtype test ids are fp16 and bf16) or node ids), BENCH=quick|full|0, BENCH_ARGS, TUNE="candidate;candidate..." (benchmarks/tune/tune.sh; empty: no tuning),
# SANITIZE=1|0 (compute-sanitizer memcheck, racecheck and synccheck on scripts/sanitize.py), STEP_TIMEOUT
# (seconds allowed to the tests and to the benchmark each, default 1800), BENCH_VARLEN=1 (the
# varlen benchmark, benchmarks/benchmark_varlen.py --json), BENCH_KVCACHE=1 (the decoding benchmark,
# benchmarks/benchmark_kvcache.py --json), HOST_OVERHEAD=1 (host time of each
# layer of ours and of SDPA flash, benchmarks/host_overhead.py --layers, at seqlen 512 causal),
# BENCH_VARIANTS="args" (benchmarks/benchmark_variants.py --json args), PROFILE="d:seqlen:causal ..."
# (ncu on the forward of each problem, scripts/profile_fwd.py: speed of light, compute pipes, warp
# states, plus PROFILE_ARGS; the reports as text in $OUT/ncu.txt).
# Results (the benchmarks' JSON files, tune.txt) go to $OUT (default ./gpu_out), the logs into
# $OUT/logs.tgz, packed on exit: the device tool brings back at most 8 files from $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
LOG=$(mktemp -d)
mkdir -p "$OUT"
trap 'tar czf "$OUT/logs.tgz" -C "$LOG" .' EXIT
trap 'exit 143' TERM
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export FLASH_ATTN_CUDA_ARCHS=${FLASH_ATTN_CUDA_ARCHS:-90} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# The device image points CXX at a wrapper that links libstdc++ statically; the extension then
# crashes in std::ostream as soon as an error message formats a number (seen 2026-11-23). Build
# with the system compiler, whose libstdc++ is the one torch and Python have loaded.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
summary=()
failed=0

if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$LOG/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$LOG/gpu.txt"

start=$(date +%s)
if [ "${BUILD:-1}" = 0 ]; then
    python3 -m flash_attn_cuda > "$LOG/build.log" 2>&1 || { cat "$LOG/build.log"; exit 1; }
    summary+=("build: none, the module in place ($(grep -E '^built:' "$LOG/build.log"))")
elif python3 setup.py build_ext --inplace > "$LOG/build.log" 2>&1; then
    summary+=("build: ok in $(( $(date +%s) - start )) s (archs=$FLASH_ATTN_CUDA_ARCHS hdims=${FLASH_ATTN_HDIMS:-all} dtypes=${FLASH_ATTN_DTYPES:-all})")
else
    tail -40 "$LOG/build.log"
    echo "build: FAILED"
    exit 1
fi

if [ -n "${TUNE:-}" ]; then
    IFS=';' read -ra candidates <<< "$TUNE"
    benchmarks/tune/tune.sh "$LOG/tune" "${candidates[@]}" > "$LOG/tune.log" 2>&1 || failed=1
    cp "$LOG/tune/tune.txt" "$OUT/" 2>/dev/null
    summary+=("tune: $(wc -l < "$OUT/tune.txt" 2>/dev/null || echo 0) rows in tune.txt")
fi

if [ "${TESTS:-1}" = 1 ]; then
    timeout "${STEP_TIMEOUT:-1800}" python3 -m pytest tests -q -rs ${PYTEST_ARGS:-} > "$LOG/tests.log" 2>&1 || failed=1
    summary+=("tests: $(tail -1 "$LOG/tests.log")")
fi

if [ "${SANITIZE:-0}" = 1 ]; then
    for tool in memcheck racecheck synccheck; do
        # Without the caching allocator every tensor is its own allocation, so memcheck sees an
        # access past a tensor's end; the others keep it, for the call sanitize.py captures in a
        # CUDA graph (a capture allocates from its pool).
        no_caching=$([ $tool = memcheck ] && echo PYTORCH_NO_CUDA_MEMORY_CACHING=1)
        if env $no_caching compute-sanitizer --tool $tool --error-exitcode 1 python3 scripts/sanitize.py > "$LOG/sanitize_$tool.log" 2>&1; then
            summary+=("sanitize $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/sanitize_$tool.log" | tail -1)")
        else
            failed=1
            summary+=("sanitize $tool: FAILED ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/sanitize_$tool.log" | tail -1))")
        fi
    done
fi

case "${BENCH:-quick}" in
    quick) timeout "${STEP_TIMEOUT:-1800}" python3 benchmarks/benchmark_attn.py --quick ${BENCH_ARGS:-} > "$LOG/bench.log" 2>&1 || failed=1 ;;
    full)
        timeout "${STEP_TIMEOUT:-1800}" python3 benchmarks/benchmark_attn.py --json --memory ${BENCH_ARGS:-} > "$LOG/bench.log" 2>&1 || failed=1
        cp benchmarks/results/attn_h100*.json "$OUT/" 2>/dev/null ;;
esac

if [ "${BENCH_VARLEN:-0}" = 1 ]; then
    timeout "${STEP_TIMEOUT:-1800}" python3 benchmarks/benchmark_varlen.py --json > "$LOG/bench_varlen.log" 2>&1 || failed=1
    cp benchmarks/results/varlen_h100*.json "$OUT/" 2>/dev/null
    summary+=("varlen benchmark: $(tail -1 "$LOG/bench_varlen.log")")
fi

if [ "${BENCH_KVCACHE:-0}" = 1 ]; then
    timeout "${STEP_TIMEOUT:-1800}" python3 benchmarks/benchmark_kvcache.py --json > "$LOG/bench_kvcache.log" 2>&1 || failed=1
    cp benchmarks/results/kvcache_h100*.json "$OUT/" 2>/dev/null
    summary+=("kvcache benchmark: $(tail -1 "$LOG/bench_kvcache.log")")
fi

if [ "${HOST_OVERHEAD:-0}" = 1 ]; then
    for d in 128 64; do
        (cd benchmarks && python3 host_overhead.py --layers --causal --seqlen 512 --head-dim $d) || failed=1
    done > "$LOG/host_overhead.log" 2>&1
    cp "$LOG/host_overhead.log" "$OUT/"
fi

if [ -n "${BENCH_VARIANTS:-}" ]; then
    timeout "${STEP_TIMEOUT:-1800}" python3 benchmarks/benchmark_variants.py --json ${BENCH_VARIANTS} > "$LOG/bench_variants.log" 2>&1 || failed=1
    cp benchmarks/results/variants_h100.json "$OUT/" 2>/dev/null
fi

if [ -n "${PROFILE:-}" ]; then
    for problem in ${PROFILE}; do
        IFS=':' read -r d s c <<< "$problem"
        echo "=== forward d=$d seqlen=$s causal=$c" >> "$OUT/ncu.txt"
        timeout 300 ncu --kernel-name regex:flash_fwd --launch-skip 1 --launch-count 1 \
            --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
            --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats ${PROFILE_ARGS:-} \
            python3 scripts/profile_fwd.py "$d" "$s" "$c" >> "$OUT/ncu.txt" 2>&1 || failed=1
    done
fi

echo "================ summary ================"
grep -E "FAILED|Error" "$LOG/tests.log" 2>/dev/null | head -20
[ -f "$OUT/tune.txt" ] && cat "$OUT/tune.txt"
[ -f "$LOG/host_overhead.log" ] && cat "$LOG/host_overhead.log"
[ -f "$LOG/bench.log" ] && grep -E "^(fwd|bwd|fwd_bwd) |^dir|peak memory|^record:" "$LOG/bench.log"
[ -f "$LOG/bench_variants.log" ] && sed -n '/^variant /,$p' "$LOG/bench_variants.log"
printf '%s\n' "${summary[@]}"
exit $failed
