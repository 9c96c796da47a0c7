#include "api/families.h"

#include <cstdlib>
#include <cstring>

#include <c10/util/Exception.h>

#include "sm80/family.h"
#ifdef FLASH_ATTN_FAMILY_SM90
#include "sm90/family.h"
#endif

namespace {

enum class Forced { kNone, kSm80, kSm90 };

// FLASH_ATTN_CUDA_FAMILY: sm80 forces the FA2 family; sm90 has the Hopper family serve everything it
// supports, also where it measured slower (tests, comparisons).
Forced forced_family() {
    const char *forced = std::getenv("FLASH_ATTN_CUDA_FAMILY");
    if (forced == nullptr || forced[0] == '\0') {
        return Forced::kNone;
    }
    if (std::strcmp(forced, "sm80") == 0) {
        return Forced::kSm80;
    }
    TORCH_CHECK_VALUE(std::strcmp(forced, "sm90") == 0,
                      "FLASH_ATTN_CUDA_FAMILY must be sm80 (to force the FA2 family), sm90 (the Hopper family "
                      "wherever it supports a problem) or unset, got ", forced);
    return Forced::kSm90;
}

}  // namespace

const char *family_name(Family family) { return family == Family::kSm90 ? "sm90" : "sm80"; }

std::vector<std::string> built_families() {
    std::vector<std::string> families{"sm80"};
#ifdef FLASH_ATTN_FAMILY_SM90
    families.push_back("sm90");
#endif
    return families;
}

Family fwd_family([[maybe_unused]] const Flash_fwd_params &params, [[maybe_unused]] int sm) {
    const Forced forced = forced_family();  // read in every build, so that a bad value raises
#ifdef FLASH_ATTN_FAMILY_SM90
    if (sm == 90 && forced != Forced::kSm80 && flash::sm90::supports_fwd(params)) {
        return Family::kSm90;
    }
#endif
    return Family::kSm80;
}

bool reads_pages(Family family) { return family == Family::kSm90; }

size_t fwd_workspace_bytes(Family family, [[maybe_unused]] const Flash_fwd_params &params) {
#ifdef FLASH_ATTN_FAMILY_SM90
    if (family == Family::kSm90) {
        return flash::sm90::fwd_workspace_bytes(params);
    }
#endif
    TORCH_INTERNAL_ASSERT(family == Family::kSm80);
    return 0;  // the FA2 forward needs none
}

bool run_fwd(Family family, Flash_fwd_params &params, cudaStream_t stream) {
#ifdef FLASH_ATTN_FAMILY_SM90
    if (family == Family::kSm90) {
        return flash::sm90::run_fwd(params, stream);
    }
#endif
    TORCH_INTERNAL_ASSERT(family == Family::kSm80 && params.block_table == nullptr);
    return flash::sm80::run_fwd(params, stream);
}

Family bwd_family([[maybe_unused]] const Flash_bwd_params &params, [[maybe_unused]] int sm,
                  [[maybe_unused]] bool deterministic) {
    const Forced forced = forced_family();
#ifdef FLASH_ATTN_FAMILY_SM90
    if (sm == 90 && forced != Forced::kSm80 && flash::sm90::supports_bwd(params) &&
        (forced == Forced::kSm90 || flash::sm90::bwd_pays(params, deterministic))) {
        return Family::kSm90;
    }
#endif
    return Family::kSm80;
}

BwdWorkspace bwd_workspace(Family family, const Flash_bwd_params &params, bool deterministic) {
#ifdef FLASH_ATTN_FAMILY_SM90
    if (family == Family::kSm90) {
        return flash::sm90::bwd_workspace(params, deterministic);
    }
#endif
    TORCH_INTERNAL_ASSERT(family == Family::kSm80);
    return flash::sm80::bwd_workspace(params, deterministic);
}

bool run_bwd(Family family, Flash_bwd_params &params, cudaStream_t stream) {
#ifdef FLASH_ATTN_FAMILY_SM90
    if (family == Family::kSm90) {
        return flash::sm90::run_bwd(params, stream);
    }
#endif
    TORCH_INTERNAL_ASSERT(family == Family::kSm80);
    return flash::sm80::run_bwd(params, stream);
}
