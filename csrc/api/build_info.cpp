// The pybind11 module flash_attn_cuda._C: what was built, the sm80 dispatch tables, which family
// serves a forward, and dropout's keep rule (the ops themselves are torch.ops.flash_attn_cuda,
// torch_ops.cpp).
#include <torch/extension.h>

#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "api/attention.h"
#include "api/checks.h"
#include "api/families.h"
#include "common/dropout_threshold.h"
#include "sm80/bwd_tile_config.h"
#include "sm80/family.h"
#include "sm80/fwd_tile_config.h"

namespace {

std::vector<std::string> built_dtypes() {
    std::vector<std::string> dtypes;
#ifdef FLASH_ATTN_DTYPE_FP16
    dtypes.push_back("fp16");
#endif
#ifdef FLASH_ATTN_DTYPE_BF16
    dtypes.push_back("bf16");
#endif
    return dtypes;
}

py::dict built_config() {
    py::dict family_head_dims;
    family_head_dims["sm80"] = std::vector<int>{FLASH_ATTN_SM80_HDIMS};
#ifdef FLASH_ATTN_FAMILY_SM90
    family_head_dims["sm90"] = std::vector<int>{FLASH_ATTN_SM90_HDIMS};
#endif
    py::dict config;
    config["archs"] = std::vector<int>(std::begin(kBuiltArchs), std::end(kBuiltArchs));
    config["families"] = built_families();
    // The FA2 family has every built head dim; the others a subset.
    config["head_dims"] = family_head_dims["sm80"];
    config["family_head_dims"] = family_head_dims;
    config["dtypes"] = built_dtypes();
    return config;
}

py::tuple fwd_kernel_config(int head_dim, bool causal, bool dropout) {
    const flash::sm80::FwdTileConfig cfg = flash::sm80::fwd_tile_config(head_dim, causal, dropout);
    return py::make_tuple(cfg.block_m, cfg.block_n, cfg.num_warps);
}

py::dict bwd_kernel_config(int head_dim, bool large_smem) {
    const flash::sm80::BwdTileConfig cfg = flash::sm80::bwd_tile_config(head_dim, large_smem);
    py::dict config;
    config["block_m"] = cfg.block_m;
    config["block_n"] = cfg.block_n;
    config["num_warps"] = cfg.num_warps;
    config["atom_m_sdp"] = cfg.atom_m_sdp;
    config["atom_m_dkv"] = cfg.atom_m_dkv;
    config["atom_m_dq"] = cfg.atom_m_dq;
    config["stages_q_do"] = cfg.stages_q_do;
    config["dq_before_dk"] = cfg.dq_before_dk;
    config["smem_bytes"] = flash::sm80::bwd_smem_bytes(cfg, head_dim);
    return config;
}

std::string family_of_fwd(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                       const std::optional<at::Tensor> &cu_seqlens_q, const std::optional<at::Tensor> &cu_seqlens_k,
                       int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal,
                       double dropout_p, bool return_softmax) {
    return mha_fwd_family(q, k, v, cu_seqlens_q, cu_seqlens_k,
                          AttentionOptions{max_seqlen_q, max_seqlen_k, softmax_scale, causal, -1, -1, 0.0, std::nullopt, false,
                                           dropout_p, return_softmax});
}

// The (float16 threshold, invert) with which the kernels keep keep_count of the 2^16 dropout numbers.
std::pair<uint32_t, bool> dropout_threshold_of(int64_t keep_count) {
    TORCH_CHECK_VALUE(keep_count >= 1 && keep_count <= 65536, "keep_count must be in [1, 65536], got ", keep_count);
    const auto rule = flash::dropout_threshold(static_cast<uint32_t>(keep_count));
    return {rule.threshold, rule.invert};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "FlashAttention kernels (CUDA, CuTe): what was built, the FA2 family's dispatch tables and "
              "which family serves a forward; the ops are torch.ops.flash_attn_cuda";
    m.def("built_config", &built_config, "archs, kernel families, head dims and dtypes this build has kernels for");
    m.def("fwd_kernel_config", &fwd_kernel_config,
          "(block_m, block_n, num_warps) of the FA2 family's forward at a kernel head dim", py::arg("head_dim"),
          py::arg("causal"), py::arg("dropout") = false);
    m.def("bwd_kernel_config", &bwd_kernel_config,
          "the FA2 family's backward table entry at a kernel head dim (large_smem: the entry for GPUs with the room "
          "for it)",
          py::arg("head_dim"), py::arg("large_smem") = false);
    m.def("fwd_family", &family_of_fwd, "the family (sm80 or sm90) that runs this forward on these tensors' GPU",
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"),
          py::arg("max_seqlen_q"), py::arg("max_seqlen_k"), py::arg("softmax_scale"), py::arg("causal"),
          py::arg("dropout_p") = 0.0, py::arg("return_softmax") = false);
    m.def("dropout_threshold", &dropout_threshold_of,
          "(float16 threshold bits, invert) of dropout's keep rule for keep_count of the 2^16 numbers",
          py::arg("keep_count"));
}
