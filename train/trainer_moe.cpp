// The trainer's side of mixture-of-experts layers: the routing statistics of a step summed over the
// data-parallel ranks (each routes its own micro-batches; with the cp ranks, each routing its own
// chunks of them), the tensor-parallel ranks under sequence
// parallelism (each routes its own rows) and the pipeline stages (each holds its own layers), the routing bias update of aux-loss-free balancing (DeepSeek-V3) from those sums, so
// that every replica keeps the same bias, and the bias in checkpoints.
#include <algorithm>
#include <string>

#include "moe/router.h"
#include "runtime/check.h"
#include "train/trainer.h"

namespace mt::train {

nlohmann::json Trainer::finish_moe_step() {
  const model::MoeConfig& mc = o_.model.moe;
  const int E = mc.experts;
  parallel::Comm& dp = replicas();  // dp, or dp x cp: each cp rank routes its own chunks' tokens
  const std::vector<model::MoeLayerStats>& stats = gpt_->moe_stats();
  // Per mixture layer: loads, assignments, drops, tokens (int32: a step's assignments per rank fit),
  // then the token-weighted sums; zero for a layer another pipeline stage holds, so that the sums over
  // dp and then pp give every rank the whole model's figures.
  std::vector<int> layers;
  for (int l = 0; l < o_.model.n_layer; l++)
    if (o_.model.is_moe_layer(l)) layers.push_back(l);
  const size_t W = size_t(E) + 3;
  std::vector<int32_t> counts(layers.size() * W, 0);
  std::vector<double> sums(layers.size() * 2, 0.0);
  for (size_t i = 0; i < layers.size(); i++) {
    if (gpt_->layer_unit(layers[i]) < 0) continue;  // held by another stage
    const model::MoeLayerStats& s = stats[size_t(layers[i])];
    for (int e = 0; e < E; e++) counts[i * W + size_t(e)] = int32_t(s.load[size_t(e)]);
    counts[i * W + size_t(E)] = int32_t(s.assignments);
    counts[i * W + size_t(E) + 1] = int32_t(s.dropped);
    counts[i * W + size_t(E) + 2] = int32_t(s.tokens);
    sums[2 * i] = s.balance;
    sums[2 * i + 1] = s.z;
  }
  dp.all_reduce(counts.data(), counts.size(), DType::i32, parallel::ReduceOp::sum);
  for (double& x : sums) x = parallel::all_reduce_sum_double(dp, x);
  if (o_.sequence_parallel()) {  // each tp rank routed its own rows (without sp all route the same)
    mesh_->tp_comm().all_reduce(counts.data(), counts.size(), DType::i32, parallel::ReduceOp::sum);
    for (double& x : sums) x = parallel::all_reduce_sum_double(mesh_->tp_comm(), x);
  }
  if (mesh_->pp() > 1) {
    mesh_->pp_comm().all_reduce(counts.data(), counts.size(), DType::i32, parallel::ReduceOp::sum);
    for (double& x : sums) x = parallel::all_reduce_sum_double(mesh_->pp_comm(), x);
  }
  nlohmann::json per_expert = nlohmann::json::array();
  double aux = 0, z = 0, balance = 0, imbalance = 0;
  int64_t assignments = 0, dropped = 0;
  for (size_t i = 0; i < layers.size(); i++) {
    const int32_t* c = &counts[i * W];
    const std::vector<int64_t> load(c, c + E);
    const double tokens = std::max(1, c[E + 2]);
    const double bal = sums[2 * i] / tokens, zl = sums[2 * i + 1] / tokens;
    assignments += c[E];
    dropped += c[E + 1];
    balance += bal;
    if (mc.balance == model::MoeBalance::aux) aux += mc.aux_coef * bal;
    z += mc.z_coef * zl;
    imbalance = std::max(imbalance, moe::load_imbalance(load));
    per_expert.push_back(load);
    if (mc.balance == model::MoeBalance::bias && gpt_->layer_unit(layers[i]) >= 0)
      moe::update_bias(gpt_->moe_bias(layers[i]), load, float(mc.bias_rate));
  }
  const int n = int(layers.size());
  return {{"aux_loss", aux}, {"z_loss", z}, {"balance", n ? balance / n : 0.0},
          {"drop_fraction", assignments ? double(dropped) / double(assignments) : 0.0}, {"imbalance", imbalance},
          {"tokens_per_expert", per_expert}};
}

nlohmann::json Trainer::moe_bias_json() {
  // Under pipeline parallelism each stage holds its own layers' biases: summed over pp with zeros for
  // the others (exact), every rank has all of them. Collective over pp.
  const int E = o_.model.moe.experts;
  std::vector<int> layers;
  for (int l = 0; l < o_.model.n_layer; l++)
    if (o_.model.is_moe_layer(l)) layers.push_back(l);
  std::vector<float> all(layers.size() * size_t(E), 0.f);
  for (size_t i = 0; i < layers.size(); i++)
    if (gpt_->layer_unit(layers[i]) >= 0) std::copy_n(gpt_->moe_bias(layers[i]).begin(), E, all.begin() + i * E);
  if (mesh_->pp() > 1) mesh_->pp_comm().all_reduce(all.data(), all.size(), DType::f32, parallel::ReduceOp::sum);
  nlohmann::json j = nlohmann::json::object();
  for (size_t i = 0; i < layers.size(); i++)
    j[std::to_string(layers[i])] = std::vector<float>(all.begin() + i * E, all.begin() + (i + 1) * E);
  return j;
}

void Trainer::restore_moe_bias(const nlohmann::json& meta, const std::string& ckpt_path) {
  if (!o_.model.moe.enabled()) return;
  if (!meta.contains("moe_bias")) return;  // saved before the bias existed: zero, as at step 0
  const nlohmann::json& j = meta.at("moe_bias");
  for (int l = 0; l < o_.model.n_layer; l++) {
    if (!o_.model.is_moe_layer(l) || gpt_->layer_unit(l) < 0) continue;  // dense, or another stage's
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
