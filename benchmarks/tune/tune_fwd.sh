#!/usr/bin/env bash
# Builds tune_fwd.cu once per candidate "hdim block_m block_n warps [csrc_dir]" (in parallel), then
# runs each in turn. csrc_dir (default csrc/) times the kernel sources in another directory, to
# compare a variant of the kernel with the current one in the same run.
# Usage: benchmarks/tune/tune_fwd.sh OUTDIR "64 128 64 4" "128 128 64 8 /tmp/variant/csrc" ...
set -euo pipefail
out=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cutlass_inc=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")
nvcc=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
bin=$(mktemp -d)
mkdir -p "$out"
name() { echo "tune_$1_$2_$3_$4_$(echo "${5:-csrc}" | tr -c 'a-zA-Z0-9\n' '_')"; }
build() {
    set -- $1
    local csrc=${5:-$root/csrc} n
    n=$(name "$@")
    "$nvcc" -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -gencode=arch=compute_90,code=sm_90 -Xptxas -v \
        -I"$csrc" -I"$cutlass_inc" -DTUNE_HDIM=$1 -DTUNE_BLOCK_M=$2 -DTUNE_BLOCK_N=$3 -DTUNE_WARPS=$4 \
        "$here/tune_fwd.cu" -o "$bin/$n" > "$bin/$n.build.log" 2>&1 || { cat "$bin/$n.build.log"; return 1; }
}
export -f build name; export nvcc here root cutlass_inc bin
printf '%s\n' "$@" | xargs -P "${MAX_JOBS:-16}" -I{} bash -c 'build "{}"'
for cfg in "$@"; do
    set -- $cfg
    n=$(name "$@")
    spills=$(grep -o '[0-9]* bytes spill stores' "$bin/$n.build.log" | sort -n | tail -1)
    "$bin/$n" | sed "s|\$| src=${5:-csrc} spill=${spills%% *}|"
done | tee "$out/tune_fwd.txt"
