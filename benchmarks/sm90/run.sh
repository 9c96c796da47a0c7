#!/usr/bin/env bash
# Builds the standalone Hopper forward harness (one object per instance, in parallel) and runs it.
#
#   benchmarks/sm90/run.sh [build|check|quick|bench|all] [head dims...]
#
# Default: all, head dims 64 96 128 192 256. The ptxas register/spill lines of every instance go
# to $BUILD/ptxas.txt. Environment: CUTLASS_INCLUDE, where the CUTLASS headers are (default:
# those of the nvidia-cutlass wheel); NVCC, the compiler; DTYPES (default "bf16 fp16");
# SM90_VARIANT, a folder holding another sm90/ tree to build instead of csrc/sm90 (A/B timing of a
# snapshot), BUILD, the build folder (default benchmarks/sm90/build), and NVCC_FLAGS, more nvcc flags
# (split on spaces).
set -euo pipefail
cd "$(dirname "$0")/../.."

MODE=${1:-all}
shift || true
HDIMS=${*:-64 96 128 192 256}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
CUTLASS_INCLUDE=${CUTLASS_INCLUDE:-$(python3 -c \
    "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")}
DTYPES=${DTYPES:-bf16 fp16}
BUILD=${BUILD:-benchmarks/sm90/build}
VARIANT_INCLUDE=()
if [ -n "${SM90_VARIANT:-}" ]; then
    VARIANT_INCLUDE=(-I "$SM90_VARIANT")
fi
FLAGS=(-std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a
       "${VARIANT_INCLUDE[@]}" -I csrc -I "$CUTLASS_INCLUDE" ${NVCC_FLAGS:-})
mkdir -p "$BUILD"

pids=()
objs=()
defines=()
for dtype in $DTYPES; do
    defines+=("-DWITH_DTYPE_${dtype^^}")
done
for d in $HDIMS; do
    defines+=("-DWITH_HDIM_$d")
    for dtype in $DTYPES; do
        element=$([ "$dtype" = bf16 ] && echo cutlass::bfloat16_t || echo cutlass::half_t)
        for causal in false true; do
            name=fwd_d${d}_${dtype}_$([ "$causal" = true ] && echo causal || echo full)
            objs+=("$BUILD/$name.o")
            "$NVCC" "${FLAGS[@]}" -Xptxas -v -DHEAD_DIM="$d" -DELEMENT="$element" -DIS_CAUSAL="$causal" \
                -c benchmarks/sm90/fwd_instantiation.cu -o "$BUILD/$name.o" >"$BUILD/$name.log" 2>&1 &
            pids+=($!)
        done
    done
done
"$NVCC" "${FLAGS[@]}" "${defines[@]}" -c benchmarks/sm90/check_fwd.cu -o "$BUILD/check_fwd.o" \
    >"$BUILD/check_fwd.log" 2>&1 &
pids+=($!)
failed=0
for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
done
for log in "$BUILD"/fwd_d*.log; do
    echo "== $(basename "$log" .log)"
    grep -E "warning|error|registers|spill" "$log" || true
done >"$BUILD/ptxas.txt"
if [ "$failed" != 0 ]; then
    cat "$BUILD"/*.log
    exit 1
fi
"$NVCC" -gencode=arch=compute_90a,code=sm_90a "$BUILD/check_fwd.o" "${objs[@]}" -o "$BUILD/check_fwd"
grep -E "==|registers|spill|C7508" "$BUILD/ptxas.txt"

case "$MODE" in
    build) ;;
    check) "$BUILD/check_fwd" check ;;
    quick) "$BUILD/check_fwd" check quick ;;
    bench) "$BUILD/check_fwd" bench ;;
    all)
        status=0
        "$BUILD/check_fwd" check || status=$?
        "$BUILD/check_fwd" bench
        exit $status
        ;;
    *) echo "unknown mode $MODE" >&2; exit 2 ;;
esac
