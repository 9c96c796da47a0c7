#!/usr/bin/env bash
# Builds tune_fwd.cu once per candidate "hdim block_m block_n warps" (in parallel) and runs each.
# Usage: benchmarks/tune/tune_fwd.sh OUTDIR "64 128 64 4" "128 128 64 8" ...
set -euo pipefail
out=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cutlass_inc=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")
nvcc=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
bin=$(mktemp -d)
mkdir -p "$out"
build() {
    set -- $1
    "$nvcc" -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -gencode=arch=compute_90,code=sm_90 -Xptxas -v \
        -I"$root/csrc" -I"$cutlass_inc" -DTUNE_HDIM=$1 -DTUNE_BLOCK_M=$2 -DTUNE_BLOCK_N=$3 -DTUNE_WARPS=$4 \
        "$here/tune_fwd.cu" -o "$bin/tune_$1_$2_$3_$4" > "$bin/tune_$1_$2_$3_$4.build.log" 2>&1 ||
        { cat "$bin/tune_$1_$2_$3_$4.build.log"; return 1; }
}
export -f build; export nvcc here root cutlass_inc bin
printf '%s\n' "$@" | xargs -P "${MAX_JOBS:-16}" -I{} bash -c 'build "{}"'
for cfg in "$@"; do
    set -- $cfg
    "$bin/tune_$1_$2_$3_$4"
done | tee "$out/tune_fwd.txt"
