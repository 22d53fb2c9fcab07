// The trainer's side of expert parallelism's storage (--ep E' > 1 with a mixture model): each rank
// holds E/E' routed experts of every mixture layer in a ParamStore of their own (model::ExpertPlacement),
// with a second DataParallel over the expert-data group (the dp x cp ranks with the same ep rank,
// parallel/mesh.h), the experts' own AdamW moments, and, under tensor parallelism, their own hooks
// summing sequence-parallel partial gradients over tp. Dense weights keep dp x cp.
//
// Counting each parameter once over the mesh: an expert's reduced gradient is identical on its
// expert-data group (summed over it there under ZeRO), the ep group holds each expert on one rank (so
// the ep sum adds every expert once), and a replica over tp is counted on tp rank 0 only.
#include <algorithm>

#ifdef MT_HAVE_NCCL
#endif
#include "runtime/check.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::build_expert_state(const parallel::DataParallelOptions& dense) {
  parallel::Comm& xdata = mesh_->expert_data_comm();
  parallel::DataParallelOptions xo = dense;
  xo.embedding_rows = false;  // no embedding here
  parallel::Comm* xdata_device = nullptr;
#ifdef MT_HAVE_NCCL
  if (device_comm(parallel::MeshGroup::expert_data, /*experts_apart=*/true))  // called only when they are
    xdata_device = &mesh_->add_device_comm(parallel::MeshGroup::expert_data, ctx_.stream);
#endif
  expert_dp_ = std::make_unique<parallel::DataParallel>(expert_store_, xdata, arena_, xo, ctx_, xdata_device);
  if (tp_.active()) {
    expert_tp_grads_ = std::make_unique<parallel::TensorParallelGrads>(expert_store_, tp_, *expert_dp_);
    gpt_->set_expert_hooks(expert_tp_grads_.get());
  } else {
    gpt_->set_expert_hooks(expert_dp_.get());
  }
  expert_adam_ = std::make_unique<AdamW>(o_.optim, expert_store_, expert_dp_->segments(), arena_);
}

std::vector<char> Trainer::expert_counted_entries() const {
  std::vector<char> counted;
  for (const ParamEntry& e : expert_store_.entries()) counted.push_back(!(e.replicated & kAxisTp) || tp_.rank() == 0);
  return counted;
}

bool Trainer::experts_held_apart() const { return mesh_->ep() > 1 && o_.model.moe.enabled(); }

double Trainer::expert_grad_sum_squares() {
  if (!experts_held_apart()) return 0;
  // A pipeline stage without mixture layers holds no experts: it adds zero (its ep group alike).
  const double mine = expert_dp_ ? expert_dp_->grad_sum_squares(expert_counted_entries()) : 0.0;
  return parallel::all_reduce_sum_double(mesh_->ep_comm(), mine);
}

bool Trainer::expert_grads_finite() {
  if (!experts_held_apart()) return true;
  int32_t bad = expert_dp_ && !expert_dp_->grads_finite() ? 1 : 0;
  mesh_->ep_comm().all_reduce(&bad, 1, DType::i32, parallel::ReduceOp::max);
  return bad == 0;
}

}  // namespace mt::train
