#include "config/limits.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "config/options.h"
#include "runtime/check.h"

namespace mt::config {
namespace {

constexpr double p2(int k) { return double(int64_t(1) << k); }

// The bounds of single options. Dimensions: 2^24 tokens of vocabulary or context, 2^20 of width, 2^16
// layers, heads or experts. Ranks: 2^20 on any axis. The others bound what a run allocates per unit
// (prefetched batches, threads, a gradient bucket) or a factor a mixture multiplies by (capacity).
const std::map<std::string, double>& limits() {
  static const std::map<std::string, double> table = {
      {"model.vocab_size", p2(24)}, {"model.block_size", p2(24)}, {"model.n_embd", p2(20)},
      {"model.n_layer", p2(16)},    {"model.n_head", p2(16)},     {"moe.experts", p2(16)},
      {"moe.top_k", p2(16)},        {"moe.every", p2(16)},        {"moe.shared", p2(16)},
      {"moe.capacity", p2(16)},     {"batch_size", p2(24)},       {"grad_accum", p2(24)},
      {"parallel.dp", p2(20)},      {"parallel.tp", p2(20)},      {"parallel.pp", p2(20)},
      {"parallel.cp", p2(20)},      {"parallel.ep", p2(20)},      {"pp.virtual", p2(16)},
      {"parallel.bucket_mb", p2(20)}, {"data.prefetch", 1024},    {"threads", p2(16)},
  };
  return table;
}

// "1048576 (2^20)" for a power of two, else the number.
std::string bound_text(double b) {
  for (int k = 10; k < 63; k++)
    if (b == p2(k)) return strfmt("%.0f (2^%d)", b, k);
  return strfmt("%.15g", b);
}

}  // namespace

double option_limit(const std::string& key) {
  auto it = limits().find(key);
  return it == limits().end() ? -1 : it->second;
}

void check_option_limit(const std::string& key, double x) {
  const double b = option_limit(key);
  if (b >= 0 && x > b)
    fail("%s=%.15g is beyond what minitrain's arithmetic holds: at most %s", key.c_str(), x,
         bound_text(b).c_str());
}

void check_size_limits(const TrainOptions& o) {
  const model::GPTConfig& m = o.model;
  // num_params() in doubles (the int64 version could wrap before this check has run).
  const double C = m.n_embd, L = m.n_layer, mlp = 8 * C * C + 5 * C;
  const double layer = 4 * C + 3 * C * C + 3 * C + C * C + C + mlp;
  const double moe_layers = m.moe.enabled() ? double(m.n_layer / std::max(1, m.moe.every)) : 0;
  const double moe_extra = m.moe.enabled() ? m.moe.experts * C + (m.moe.experts + m.moe.shared - 1.0) * mlp : 0;
  const double params = (double(m.vocab_size) + m.block_size) * C + L * layer + moe_layers * moe_extra + 2 * C;
  if (params > kMaxParams)
    fail("the model has %.3g parameters, beyond what minitrain's arithmetic holds: at most %s (model.n_embd=%d, "
         "model.n_layer=%d, model.vocab_size=%d%s)", params, bound_text(kMaxParams).c_str(),
         m.n_embd, m.n_layer, m.vocab_size,
         m.moe.enabled() ? strfmt(", moe.experts=%d", m.moe.experts).c_str() : "");
  const double A = o.grad_accum;
  if (params * A > kMaxGradientElementsPerStep)
    fail("the model's %.3g parameters x grad_accum %d = %.3g gradient elements per step, beyond what minitrain's "
         "arithmetic holds: at most %s", params, o.grad_accum, params * A, bound_text(kMaxGradientElementsPerStep).c_str());
  // With global_batch the rows of a step are global_batch; without, B x accum x dp, dp at least 1
  // until the world size resolves it.
  const double dp = std::max(1, o.parallel.dp), T = o.seq_len;
  const std::string rows = o.global_batch > 0
                               ? strfmt("global_batch %d", o.global_batch)
                               : strfmt("batch_size %d x grad_accum %d x dp %.0f", o.batch_size, o.grad_accum, dp);
  const double tokens = (o.global_batch > 0 ? double(o.global_batch) : o.batch_size * A * dp) * T;
  if (tokens > kMaxTokensPerStep)
    fail("%s x seq_len %d = %.3g tokens per step, beyond what minitrain's arithmetic holds: at most %s", rows.c_str(),
         o.seq_len, tokens, bound_text(kMaxTokensPerStep).c_str());
  const double k = m.moe.enabled() ? m.moe.top_k + m.moe.shared : 1;
  const double acts = tokens * L * (C * k + double(m.n_head) * T);
  if (acts > kMaxActivationElements)
    fail("%s x seq_len %d x model.n_layer %d x (model.n_embd %d%s + model.n_head %d x seq_len) = %.3g activation "
         "elements per step, beyond what minitrain's arithmetic holds: at most %s", rows.c_str(), o.seq_len, m.n_layer,
         m.n_embd, m.moe.enabled() ? " x (moe.top_k + moe.shared)" : "", m.n_head, acts,
         bound_text(kMaxActivationElements).c_str());
  const double ranks = dp * o.parallel.tp * o.parallel.pp * o.parallel.cp;
  if (ranks > double(kMaxRanks))
    fail("dp %.0f x tp %d x pp %d x cp %d = %.0f ranks, beyond what minitrain's arithmetic holds: at most %s", dp,
         o.parallel.tp, o.parallel.pp, o.parallel.cp, ranks, bound_text(double(kMaxRanks)).c_str());
}

}  // namespace mt::config
