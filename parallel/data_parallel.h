// Data parallelism over a ParamStore: gradient reduction overlapped with backward, and ZeRO stages
// 1-3 (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models"). The model drives it through UnitHooks (runtime/param_store.h); the optimizer runs on the
// shard it exposes.
//
//   stage  master + AdamW state   gradients                         compute parameters
//   0      full on every rank     all-reduced (bucketed)            full
//   1      shard                  all-reduced (bucketed)            full, all-gathered after the step
//   2      shard                  per unit: a buffer while backward full, all-gathered after the step
//                                 fills it, reduce-scattered into
//                                 the shard every micro-batch
//   3      shard                  as stage 2                        shard; each unit all-gathered just
//                                                                   before use (forward, and again in
//                                                                   backward) and freed after, the
//                                                                   next unit prefetched
//
// Sharding (as PyTorch FSDP's flat parameters): every unit of the store is padded to a multiple of
// dp, and rank r owns chunk r of every unit. Its shard is the concatenation of those chunks
// (`segments()`), so master_shard(), grad_shard() and the optimizer's moments share one layout.
//
// Reductions are SUMs: the trainer scales the loss by 1 / (valid tokens of the global batch), so the
// summed gradient is the gradient of the global mean loss. Stages 0-1 reduce only during the last
// micro-batch of a step (the earlier ones accumulate locally in the full gradient buffer); stages
// 2-3 keep no full gradient buffer, so they reduce every micro-batch. A reduction starts as soon as
// its unit is final (stages 0-1 group consecutive units into buckets of about bucket_bytes) and
// overlaps the rest of backward; outstanding requests are polled at every unit boundary so MPI makes
// progress.
//
// Devices. With the store and the ops on a GPU, gradient and parameter collectives go through a
// device communicator (NcclComm: a communication stream ordered after the compute stream by events,
// parallel/nccl_comm.h), so reductions overlap backward without host synchronisation; scalars
// (norms, the overflow flag) and checkpoint gathers go through the host communicator `dp`. The
// embeddings' row gradients are a host-memory optimisation and stay off on a device.
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "kernels/ops.h"
#include "parallel/comm.h"
#include "runtime/arena.h"
#include "runtime/param_store.h"

namespace mt::parallel {

struct Segment {
  int64_t begin = 0, end = 0;  // flat range of the store
  int64_t size() const { return end - begin; }
};

struct DataParallelOptions {
  int zero = 0;                        // ZeRO stage 0..3
  size_t bucket_bytes = size_t(4) << 20;  // stages 0-1: gradient bytes per all-reduce
  // Stages 0-2, several ranks, CPU: take the embeddings' sparse gradient as rows (see
  // wants_row_grads). Off under tensor parallelism, whose embedding is split by vocabulary rows.
  bool embedding_rows = true;
};

// Communication timing of the last step: issue = time inside the calls that start reductions (and
// gathers), wait = time blocked waiting for them to complete (exposed, not overlapped).
struct DataParallelStats {
  double grad_wait_s = 0;    // blocked in finish_grads() after backward
  double grad_poll_s = 0;    // progress polling during backward
  double gather_wait_s = 0;  // ZeRO-3 parameter gathers
  int reductions = 0;
  int local_grad_sq_first_unit = 0;  // local_grad_sq() covers units from here on (1 when unit 0 went as rows)
  bool local_grad_sq_valid = false;  // false when no rank ever held its whole local gradient
};

// The ParamStore storage each stage works on (finalize the store with it).
Storage storage_for_zero(int zero);
const char* storage_name(int zero);

class DataParallel final : public UnitHooks {
 public:
  // `store` is finalized with shard_multiple = dp.size() (materialize = zero < 3) and its full master
  // holds the initial weights, identical on every rank. From stage 1 on the full master is released.
  // `device_comm` (same ranks as dp, on ctx.device) carries the gradient and parameter collectives when
  // the buffers live on a GPU; it is required there unless dp has one rank and zero = 0.
  DataParallel(ParamStore& store, Comm& dp, Arena& arena, const DataParallelOptions& o, const ops::Ctx& ctx,
               Comm* device_comm = nullptr);
  ~DataParallel() override;

  int zero() const { return o_.zero; }
  const std::vector<Segment>& segments() const { return segments_; }
  int64_t shard_numel() const { return shard_numel_; }
  float* master_shard() const { return master_shard_; }
  float* grad_shard() const { return grad_shard_; }

  // Zeroes the gradients (full buffer or shard) and the step's statistics.
  void begin_step();
  // Declares whether the micro-batch about to run is the step's last (stages 0-2 reduce only then).
  void set_last_micro(bool last) {
    last_micro_ = last;
    micros_++;
  }
  // True when grads_ready() of this micro-batch starts a reduction (stages 0-1: the last micro-batch
  // only; stages 2-3: every one), i.e. when a unit's gradient must be complete on this rank.
  bool reduces_this_micro() const { return last_micro_ || o_.zero >= 2; }

  void acquire(int u, bool with_grads) override;
  void release(int u) override;
  void grads_ready(int u) override;
  // Stages 0-2 with several ranks, during the reducing micro-batch: take the embeddings' sparse
  // gradient as rows, so their dense part is reduced from the start of backward. The rows of all
  // ranks are all-gathered after backward (N x C values per rank instead of V x C) and added to the
  // reduced gradient in rank order.
  bool wants_row_grads(int u) override;
  void add_row_grads(int u, const std::vector<RowGrads>& rows) override;

  // Waits for every outstanding reduction; afterwards grad_shard() holds this rank's part of the
  // summed gradient.
  void finish_grads();
  // Sum of squares of the reduced gradient of units [first_unit, end) (identical on every rank).
  double grad_sum_squares(int first_unit = 0);
  // The same over the entries with counted[i] != 0 only (a replicated entry counted on one rank of a
  // tensor-parallel group, every split entry on all), summed over dp: identical on the dp ranks.
  double grad_sum_squares(const std::vector<char>& counted);
  // True when this rank holds the whole reduced gradient (stage 0, or one rank), so that its sum of
  // squares needs no cross-rank sum: grad_sum_squares_into can then leave it in device memory.
  bool grad_norm_is_local() const { return o_.zero == 0 || size_ == 1; }
  // grad_sum_squares() at *out, in the memory of the arena's device, without waiting for it (needs
  // grad_norm_is_local()).
  void grad_sum_squares_into(double* out);
  // Which entries local_grad_sq() counts (default: all). Tensor parallelism counts a replicated entry
  // on one tp rank only, so that the sum over tp is the whole model's |g|^2 once.
  void set_counted_entries(std::vector<char> counted) { counted_ = std::move(counted); }
  // |g|^2 of this rank's own gradient before reduction (stages 0-2; 0 when not noted this step), over
  // the units from stats().local_grad_sq_first_unit on (and the counted entries). Accumulated on the device during backward;
  // reading it waits for the device.
  double local_grad_sq() const;
  // True when no gradient anywhere is inf/NaN (agreed across ranks).
  bool grads_finite();
  // After the optimizer updated master_shard(): derives the compute parameters (rounded to the
  // compute precision) and all-gathers them where every rank needs them whole.
  void publish_params();

  // Full <-> shard conversions in the shard layout (for master weights and optimizer moments):
  // gather_full assembles the whole vector (total_numel) on every rank, in host memory; take_shard
  // copies this rank's part out of a whole vector in the arena's memory.
  void gather_full(const float* shard, float* full);
  void take_shard(const float* full, float* shard) const;

  const DataParallelStats& stats() const { return stats_; }

 private:
  struct Pending {
    CommHandle handle;
    int unit = -1;            // stage 3: unit whose reduced chunk lands in `chunk`
    Buffer grads, chunk;      // stage 3: the unit's gradient buffer and the reduced chunk
  };
  int64_t chunk_size(int u) const;    // elements of unit u owned by each rank
  int64_t shard_offset(int u) const;  // where unit u's chunk sits in the shard
  void flush_bucket();
  void apply_row_grads();
  void note_local_gradient(int u);
  void poll();
  void start_gather(int u);
  void complete(Pending& p);

  // dst (n elements of the compute dtype) = src (fp32 master values) rounded, on the ops' stream.
  void to_compute(void* dst, const float* src, int64_t n);

  ParamStore& store_;
  Comm& dp_;  // host: scalars, row gradients, checkpoint gathers
  Comm& tc_;  // tensors: gradient reductions and parameter gathers (dp_ on the CPU backend)
  Arena& arena_;
  DataParallelOptions o_;
  ops::Ctx ctx_;
  int rank_, size_;
  std::vector<Segment> segments_;
  std::vector<int64_t> shard_offsets_;
  int64_t shard_numel_ = 0;
  Buffer master_buf_, compute_shard_buf_, grad_shard_buf_;
  void* compute_shard_ = nullptr;  // stage 3: what is gathered, in the compute dtype (fp32: the master shard)
  float* master_shard_ = nullptr;
  float* grad_shard_ = nullptr;
  bool last_micro_ = true;
  int micros_ = 0;  // micro-batches started this step
  // Stages 0-1: the bucket being filled is [bucket_begin_, bucket_end_) of the flat gradients.
  int64_t bucket_begin_ = -1, bucket_end_ = -1;
  std::deque<Pending> pending_;
  std::vector<char> handed_;  // per unit: its reduction has been started this step
  struct StagedRows {
    int unit = -1, entry = -1;
    int64_t n = 0, width = 0;
    std::vector<int32_t> rows;
    std::vector<float> values;
  };
  std::vector<StagedRows> staged_rows_;
  // Stage 3: per-unit gathered parameters and gradient buffers, and gathers in flight.
  std::vector<Buffer> unit_params_, unit_grads_;
  std::vector<CommHandle> gathers_;
  int last_acquired_ = -1;
  DataParallelStats stats_;
  Buffer local_sq_buf_;  // one double: local_grad_sq(), in the arena's memory
  std::vector<char> counted_;  // per entry: counted by local_grad_sq() (empty: all)
  bool local_sq_noted_ = false;  // some unit was added to it this step
};

// Sum of one double per rank, added in rank order (exact and identical on every rank).
double all_reduce_sum_double(Comm& comm, double x);

}  // namespace mt::parallel
