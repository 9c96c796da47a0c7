// One (element type, head dim, causal) instance of the Hopper forward, for the standalone harness:
// built once per combination (-DHEAD_DIM, -DELEMENT, -DIS_CAUSAL) so that the builds run in parallel.
#include "sm90/fwd_launch.h"

template void run_mha_fwd_sm90<ELEMENT, HEAD_DIM, IS_CAUSAL>(Flash_fwd_params &params, cudaStream_t stream);
