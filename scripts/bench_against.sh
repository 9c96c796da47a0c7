#!/usr/bin/env bash
# Builds an older tree beside this one and runs benchmarks/benchmark_attn.py (this tree's) on each,
# back to back on the same GPU, so that "no speed change" is measured rather than assumed.
#   git archive COMMIT | tar x -C .ref      (an ignored folder; carry it to the GPU machine)
#   REF=.ref BENCH_ARGS="--impls flash_attn_cuda,sdpa_flash" scripts/bench_against.sh
# Environment: REF (the older tree), BENCH_ARGS, FLASH_ATTN_HDIMS / FLASH_ATTN_DTYPES (both builds),
# MAX_JOBS (split between the two builds, which run at once). Logs and tables go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} FLASH_ATTN_CUDA_ARCHS=${FLASH_ATTN_CUDA_ARCHS:-90}
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
jobs=$(( ${MAX_JOBS:-16} / 2 ))
start=$(date +%s)
(cd "$REF" && MAX_JOBS=$jobs python3 setup.py build_ext --inplace > "$OUT/build_ref.log" 2>&1) & ref_build=$!
MAX_JOBS=$jobs python3 setup.py build_ext --inplace > "$OUT/build_new.log" 2>&1 || { tail -30 "$OUT/build_new.log"; exit 1; }
wait $ref_build || { tail -30 "$OUT/build_ref.log"; exit 1; }
echo "both builds: $(( $(date +%s) - start )) s"
for tree in "$REF" .; do
    name=$([ "$tree" = . ] && echo new || echo ref)
    PYTHONPATH=$PWD/$tree:${PYTHONPATH:-} python3 benchmarks/benchmark_attn.py ${BENCH_ARGS:-} > "$OUT/bench_$name.log" 2>&1
    echo "== $name ($tree)"; grep -E "^(dir|fwd|bwd|fwd_bwd) " "$OUT/bench_$name.log"
done
