// Which kernel family serves a problem. A family is a set of kernels for one kind of hardware
// (csrc/sm80, csrc/sm90) behind host entry points that take the parameter structs; the API knows
// nothing else of them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "common/flash.h"

enum class Family { kSm80, kSm90 };

const char *family_name(Family family);

// The families this build holds.
std::vector<std::string> built_families();

// The family that runs this forward on a GPU of compute capability sm: the Hopper family where it
// is built, the GPU is sm90 and it supports the problem, else the FA2 family. The environment
// variable FLASH_ATTN_CUDA_FAMILY=sm80 forces the FA2 family (for comparisons, and as an escape hatch);
// =sm90 lets the Hopper family serve wherever it can, also where it measured slower.
Family fwd_family(const Flash_fwd_params &params, int sm);

// Whether family reads paged K and V (params.block_table): the Hopper family, where it supports
// the pages. For the other, the API gathers the pages first.
bool reads_pages(Family family);

// Bytes of scratch memory the forward on family needs at params.fwd_workspace (0: none); the caller
// allocates them on the device, the family initializes them on the launch stream.
size_t fwd_workspace_bytes(Family family, const Flash_fwd_params &params);

// Launches the forward on family; false if the build has no kernel for the params' element type
// and head dim there.
bool run_fwd(Family family, Flash_fwd_params &params, cudaStream_t stream);

// The family that runs this backward: the Hopper family where it is built, the GPU is sm90, it
// supports the problem and runs it faster (sm90/family.h), else the FA2 family;
// FLASH_ATTN_CUDA_FAMILY as for the forward (sm90: wherever the Hopper family supports it).
Family bwd_family(const Flash_bwd_params &params, int sm, bool deterministic);

// The scratch buffers the backward on family needs.
BwdWorkspace bwd_workspace(Family family, const Flash_bwd_params &params, bool deterministic);

// Launches the backward on family; false if the build has no kernel for the params there.
bool run_bwd(Family family, Flash_bwd_params &params, cudaStream_t stream);
