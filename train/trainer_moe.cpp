// The trainer's side of mixture-of-experts layers: the routing statistics of a step summed over the
// data-parallel ranks (each routes its own micro-batches), the routing bias update of aux-loss-free
// balancing (DeepSeek-V3) from those sums, so that every replica keeps the same bias, and the bias in
// checkpoints.
#include <algorithm>
#include <string>

#include "moe/router.h"
#include "runtime/check.h"
#include "train/trainer.h"

namespace mt::train {

nlohmann::json Trainer::finish_moe_step() {
  const model::MoeConfig& mc = o_.model.moe;
  parallel::Comm& dp = mesh_->dp_comm();
  const std::vector<model::MoeLayerStats>& stats = gpt_->moe_stats();
  nlohmann::json per_expert = nlohmann::json::array();
  double aux = 0, z = 0, balance = 0, imbalance = 0;
  int64_t assignments = 0, dropped = 0;
  int layers = 0;
  for (size_t l = 0; l < stats.size(); l++) {
    const model::MoeLayerStats& s = stats[l];
    if (s.load.empty()) continue;  // a dense layer
    // Counts as int32 (a step's assignments per rank fit), then the token-weighted sums.
    std::vector<int32_t> counts;
    for (int64_t x : s.load) counts.push_back(int32_t(x));
    counts.push_back(int32_t(s.assignments));
    counts.push_back(int32_t(s.dropped));
    counts.push_back(int32_t(s.tokens));
    dp.all_reduce(counts.data(), counts.size(), DType::i32, parallel::ReduceOp::sum);
    const int E = mc.experts;
    const std::vector<int64_t> load(counts.begin(), counts.begin() + E);
    const double tokens = std::max(1, counts[size_t(E) + 2]);
    const double bal = parallel::all_reduce_sum_double(dp, s.balance) / tokens;
    const double zl = parallel::all_reduce_sum_double(dp, s.z) / tokens;
    assignments += counts[size_t(E)];
    dropped += counts[size_t(E) + 1];
    balance += bal;
    if (mc.balance == model::MoeBalance::aux) aux += mc.aux_coef * bal;
    z += mc.z_coef * zl;
    imbalance = std::max(imbalance, moe::load_imbalance(load));
    per_expert.push_back(load);
    layers++;
    if (mc.balance == model::MoeBalance::bias) moe::update_bias(gpt_->moe_bias(int(l)), load, float(mc.bias_rate));
  }
  return {{"aux_loss", aux}, {"z_loss", z}, {"balance", layers ? balance / layers : 0.0},
          {"drop_fraction", assignments ? double(dropped) / double(assignments) : 0.0}, {"imbalance", imbalance},
          {"tokens_per_expert", per_expert}};
}

nlohmann::json Trainer::moe_bias_json() {
  nlohmann::json j = nlohmann::json::object();
  for (int l = 0; l < o_.model.n_layer; l++)
    if (o_.model.is_moe_layer(l)) j[std::to_string(l)] = gpt_->moe_bias(l);
  return j;
}

void Trainer::restore_moe_bias(const nlohmann::json& meta, const std::string& ckpt_path) {
  if (!o_.model.moe.enabled()) return;
  if (!meta.contains("moe_bias")) return;  // saved before the bias existed: zero, as at step 0
  const nlohmann::json& j = meta.at("moe_bias");
  for (int l = 0; l < o_.model.n_layer; l++) {
    if (!o_.model.is_moe_layer(l)) continue;
    const std::string key = std::to_string(l);
    if (!j.contains(key)) fail("%s: no routing bias for mixture layer %d", ckpt_path.c_str(), l);
    std::vector<float> b = j.at(key).get<std::vector<float>>();
    if (b.size() != size_t(o_.model.moe.experts))
      fail("%s: the routing bias of layer %d has %zu experts, not moe.experts=%d", ckpt_path.c_str(), l, b.size(),
           o_.model.moe.experts);
    gpt_->moe_bias(l) = std::move(b);
  }
}

}  // namespace mt::train
