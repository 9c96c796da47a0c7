#!/usr/bin/env bash
# Builds one timing binary per candidate (in parallel), then runs each in turn. A candidate is
# "DIRECTION KEY=VALUE ... [src=DIR]": DIRECTION picks benchmarks/tune/tune_DIRECTION.cu, each
# KEY=VALUE becomes -DTUNE_KEY=VALUE, and src=DIR times the kernel sources in DIR instead of csrc/
# (to compare a variant of the kernel with the current one in the same run).
# Usage: benchmarks/tune/tune.sh OUTDIR "fwd HDIM=128 BLOCK_M=128 BLOCK_N=64 WARPS=4" ...
set -euo pipefail
out=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cutlass_inc=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")
nvcc=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
bin=$(mktemp -d)
mkdir -p "$out"
name() { echo "tune_$(echo "$*" | tr -c 'a-zA-Z0-9\n' '_')"; }
build() {
    local direction csrc=$root/csrc defines=() n
    read -ra words <<< "$1"
    direction=${words[0]}
    for word in "${words[@]:1}"; do
        case $word in
            src=*) csrc=${word#src=} ;;
            *) defines+=("-DTUNE_$word") ;;
        esac
    done
    n=$(name "$1")
    "$nvcc" -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -gencode=arch=compute_90,code=sm_90 -Xptxas -v \
        -I"$csrc" -I"$cutlass_inc" "${defines[@]}" "$here/tune_$direction.cu" -o "$bin/$n" > "$bin/$n.build.log" 2>&1 ||
        { cat "$bin/$n.build.log"; return 1; }
}
export -f build name; export nvcc here root cutlass_inc bin
# A candidate that does not compile (e.g. a warp layout that does not divide the tile) gets one
# "build failed" row; the others still run.
printf '%s\n' "$@" | xargs -P "${MAX_JOBS:-16}" -I{} bash -c 'build "{}"' || true
for cfg in "$@"; do
    n=$(name "$cfg")
    if [ ! -x "$bin/$n" ]; then
        echo "build failed: $(grep -m1 'error' "$bin/$n.build.log") [$cfg]"
        continue
    fi
    # The spills of the timed kernel (its entries without score mod or dropout), not of the
    # binary's other kernels.
    spills=$(awk -v k="flash_${cfg%% *}_kernel" '
        /Function properties for/ {
            f = index($0, k) && !index($0, "Lb1ELNS") && !index($0, "FwdDropoutE1") && !index($0, "FwdDropoutE2")
        }
        f && /spill stores/ {
            for (i = 1; i < NF; ++i) if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $(i + 3) ~ /^stores/) print $i
        }' "$bin/$n.build.log" | sort -n | tail -1)
    # A candidate that fails at run time (e.g. more shared memory than the GPU allows) gets one
    # "run failed" row; the others still run.
    "$bin/$n" 2>&1 | sed "s|\$| [$cfg] spill=${spills%% *}|" || echo "run failed [$cfg]"
done | tee "$out/tune.txt"
