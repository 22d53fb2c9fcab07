// The experts of a mixture layer: E GPT-2 MLPs (c_fc with GELU, c_proj), each applied to its block of
// the permuted rows (moe/dispatch.h) -- a grouped GEMM run as one GEMM per expert through the op
// interface (kernels/ops.h), with GELU as the first GEMM's epilogue and its derivative fused into the
// second's backward, as the dense MLP does. An expert with no rows is skipped (its gradients get
// nothing added). No collective: on one rank every expert is local.
//
// On CUDA the same loop runs cuBLASLt matmuls (kernels/cuda/matmul.cu), one pair per expert with rows,
// sized by the plan's offsets on the host. Not one grouped call (cublasGemmGroupedBatchedEx): it takes
// no bias or GELU epilogue and no fused GELU backward, so the experts would round differently from the
// dense MLP, and it would need libcublas beside cuBLASLt.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "moe/dispatch.h"

namespace mt::moe {

// One expert's weights (fc (F, C), fc_b (F), proj (C, F), proj_b (C)) and their fp32 gradients.
template <class S>
struct ExpertWeights {
  const S *fc = nullptr, *fc_b = nullptr, *proj = nullptr, *proj_b = nullptr;
};
// The weights' gradients may be assigned (ops::GradOut): an expert's GEMMs then write them over.
struct ExpertGrads {
  ops::GradOut fc, proj;
  float *fc_b = nullptr, *proj_b = nullptr;
};

// out (M, C), h_pre and h (M, F): for each expert e, rows [offset e, offset e+1) of `in` (M, C)
// through its MLP: h_pre = in fc^T + fc_b, h = gelu(h_pre), out = h proj^T + proj_b.
template <class S>
void experts_forward(S* out, S* h_pre, S* h, const S* in, const DispatchPlan& p,
                     const std::vector<ExpertWeights<S>>& w, int C, int F, const ops::Ctx& ctx);
// din (M, C) assigned, dh (M, F) scratch; each expert's gradients accumulated.
template <class S>
void experts_backward(S* din, S* dh, const std::vector<ExpertGrads>& g, const S* dout, const S* in, const S* h_pre,
                      const S* h, const DispatchPlan& p, const std::vector<ExpertWeights<S>>& w, int C, int F,
                      const ops::Ctx& ctx);
// zb1's split of experts_backward: called with gradients whose pointers are all nullptr it makes din
// and dh only; experts_weight_backward then adds each expert's gradients from the kept dout and dh
// and the forward's in and h, with the same GEMMs, so they are the unsplit backward's bits. It reads
// no weight and moves nothing: under expert parallelism it runs where the rows were received.
template <class S>
void experts_weight_backward(const std::vector<ExpertGrads>& g, const S* dout, const S* dh, const S* in, const S* h,
                             const DispatchPlan& p, int C, int F, const ops::Ctx& ctx);

}  // namespace mt::moe
