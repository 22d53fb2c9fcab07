// The silent-data-corruption check (parallel.sdc_every): every replica of the same parameters hashes
// its compute copy and the hashes are compared; the odd one out is named. The dense weights are
// replicas over dp (x cp); the experts held apart under expert parallelism over their expert-data
// group, each compared only with the ranks holding the same experts.
#include <algorithm>

#include "runtime/check.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::check_replicas() {
  // What every data-parallel replica must hold identically: the full compute parameters (stages
  // 0-2; ZeRO-3 replicates nothing across dp, so there is nothing to compare). Experts held apart
  // are replicas over their expert-data group: compared there.
  if (o_.parallel.zero == 3) return;
  check_replicas_of(store_, replicas(), mesh_->cp() > 1 ? mesh_->cp_dp_group_ranks() : mesh_->group_ranks(parallel::MeshDim::dp),
                    true);
  if (experts_held_apart()) {
    std::vector<int> ranks(size_t(mesh_->expert_data_comm().size()));
    const int me = world_.rank();
    mesh_->expert_data_comm().all_gather(&me, ranks.data(), 1, DType::i32);
    // A stage without mixture layers compares an empty store (its expert-data group alike).
    check_replicas_of(expert_store_, mesh_->expert_data_comm(), ranks, false);
  }
}

void Trainer::check_replicas_of(const ParamStore& store, parallel::Comm& dp, const std::vector<int>& world_ranks,
                                bool flip) {
  if (dp.size() == 1) return;  // one replica: nothing to compare
  const bool held = store.finalized();
  const size_t bytes = held ? store.compute_bytes(store.total_numel()) : 0;
  std::vector<unsigned char> host;  // the parameters as host bytes (downloaded from a device)
  if (o_.device != Device::cpu && bytes) {
    host.resize(bytes);
    arena_.mem().download(host.data(), store.compute(), bytes);
  }
  unsigned char* params = host.empty() ? static_cast<unsigned char*>(held ? store.compute() : nullptr) : host.data();
  if (flip && o_.parallel.sdc_flip_step == step_ && world_.rank() == o_.parallel.sdc_flip_rank) {
    // Fault injection: one flipped bit in one weight, as a cosmic ray or a bad HBM cell would.
    params[store.compute_bytes(store.entry(std::max(gpt_->wte(), 0)).offset) + 1] ^= 1u << 4;
  }
  // FNV-1a over the bytes: cheap, and any flipped bit changes it.
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < bytes; i++) h = (h ^ params[i]) * 1099511628211ULL;
  std::vector<uint64_t> all(static_cast<size_t>(dp.size()));
  dp.all_gather(&h, all.data(), 4, DType::u16);
  // The majority hash is the healthy one (rank 0's on a tie); the others are the corrupted replicas.
  uint64_t healthy = all[0];
  int best = 0;
  for (uint64_t x : all) {
    int n = 0;
    for (uint64_t y : all) n += x == y;
    if (n > best) best = n, healthy = x;
  }
  std::vector<int> bad;
  for (int r = 0; r < dp.size(); r++)
    if (all[size_t(r)] != healthy) bad.push_back(r);
  if (!bad.empty())
    throw parallel::CollectiveError(strfmt(
        "silent data corruption check failed after step %d: the %s of data-parallel rank %d (world rank %d) differ "
        "from the other replicas",
        step_, &store == &store_ ? "parameters" : "expert parameters", bad[0], world_ranks[size_t(bad[0])]));
}

}  // namespace mt::train
