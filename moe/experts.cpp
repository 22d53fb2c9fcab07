#include "moe/experts.h"

#include "runtime/check.h"

namespace mt::moe {

template <class S>
void experts_forward(S* out, S* h_pre, S* h, const S* in, const DispatchPlan& p,
                     const std::vector<ExpertWeights<S>>& w, int C, int F, const ops::Ctx& ctx) {
  MT_CHECK(int(w.size()) == p.E, "experts_forward: %zu experts' weights for a plan of %d", w.size(), p.E);
  for (int e = 0; e < p.E; e++) {
    const int64_t r0 = p.offset[size_t(e)], n = p.rows_of(e);
    if (n == 0) continue;
    const ExpertWeights<S>& x = w[size_t(e)];
    ops::matmul_fwd(h + r0 * F, in + r0 * C, x.fc, x.fc_b, int(n), C, F, ctx, h_pre + r0 * F);  // GELU epilogue
    ops::matmul_fwd(out + r0 * C, h + r0 * F, x.proj, x.proj_b, int(n), F, C, ctx);
  }
}

template <class S>
void experts_backward(S* din, S* dh, const std::vector<ExpertGrads>& g, const S* dout, const S* in, const S* h_pre,
                      const S* h, const DispatchPlan& p, const std::vector<ExpertWeights<S>>& w, int C, int F,
                      const ops::Ctx& ctx) {
  MT_CHECK(int(w.size()) == p.E && int(g.size()) == p.E, "experts_backward: weights or gradients of %zu/%zu experts",
           w.size(), g.size());
  for (int e = 0; e < p.E; e++) {
    const int64_t r0 = p.offset[size_t(e)], n = p.rows_of(e);
    if (n == 0) continue;
    const ExpertWeights<S>& x = w[size_t(e)];
    const ExpertGrads& d = g[size_t(e)];
    // dh = gelu'(h_pre) * (dout proj): GELU's backward fused into the second GEMM's.
    ops::matmul_bwd(dh + r0 * F, d.proj, d.proj_b, dout + r0 * C, h + r0 * F, x.proj, int(n), F, C, ctx,
                    h_pre + r0 * F);
    ops::matmul_bwd(din + r0 * C, d.fc, d.fc_b, dh + r0 * F, in + r0 * C, x.fc, int(n), C, F, ctx);
  }
}

template <class S>
void experts_weight_backward(const std::vector<ExpertGrads>& g, const S* dout, const S* dh, const S* in, const S* h,
                             const DispatchPlan& p, int C, int F, const ops::Ctx& ctx) {
  MT_CHECK(int(g.size()) == p.E, "experts_weight_backward: gradients of %zu experts for a plan of %d", g.size(), p.E);
  const S* none = nullptr;  // the weights: not read without an input gradient
  for (int e = 0; e < p.E; e++) {
    const int64_t r0 = p.offset[size_t(e)], n = p.rows_of(e);
    if (n == 0) continue;
    const ExpertGrads& d = g[size_t(e)];
    ops::matmul_bwd(static_cast<S*>(nullptr), d.proj, d.proj_b, dout + r0 * C, h + r0 * F, none, int(n), F, C, ctx);
    ops::matmul_bwd(static_cast<S*>(nullptr), d.fc, d.fc_b, dh + r0 * F, in + r0 * C, none, int(n), C, F, ctx);
  }
}

#define MT_EXPERTS(S)                                                                                             \
  template void experts_forward<S>(S*, S*, S*, const S*, const DispatchPlan&, const std::vector<ExpertWeights<S>>&, \
                                   int, int, const ops::Ctx&);                                                      \
  template void experts_backward<S>(S*, S*, const std::vector<ExpertGrads>&, const S*, const S*, const S*, const S*, \
                                    const DispatchPlan&, const std::vector<ExpertWeights<S>>&, int, int,            \
                                    const ops::Ctx&);                                                               \
  template void experts_weight_backward<S>(const std::vector<ExpertGrads>&, const S*, const S*, const S*, const S*, \
                                           const DispatchPlan&, int, int, const ops::Ctx&);
MT_EXPERTS(float)
MT_EXPERTS(bf16)
MT_EXPERTS(f16)
#undef MT_EXPERTS

}  // namespace mt::moe
