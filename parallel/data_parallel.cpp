#include "parallel/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "runtime/check.h"

namespace mt::parallel {

namespace {
using clock_type = std::chrono::steady_clock;
constexpr size_t kMaxReductionsInFlight = 2;  // ZeRO-3 unit gradient buffers awaiting their reduce-scatter
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }
}  // namespace

const char* storage_name(int zero) {
  return zero < 2 ? "full" : zero == 2 ? "per-unit gradient" : "per-unit compute and gradient";
}

Storage storage_for_zero(int zero) {
  return zero < 2 ? Storage::full : zero == 2 ? Storage::per_unit_grads : Storage::per_unit;
}

double all_reduce_sum_double(Comm& comm, double x) {
  // Gather every rank's double bit-for-bit (as four u16) and add them in rank order: exact,
  // deterministic and the same on every rank, which an fp32 all-reduce would not be.
  std::vector<double> all(size_t(comm.size()));
  comm.all_gather(&x, all.data(), 4, DType::u16);
  double s = 0;
  for (double v : all) s += v;
  return s;
}

DataParallel::DataParallel(ParamStore& store, Comm& dp, Arena& arena, const DataParallelOptions& o,
                           const ops::Ctx& ctx, Comm* device_comm)
    : store_(store),
      dp_(dp),
      tc_(device_comm ? *device_comm : dp),
      arena_(arena),
      o_(o),
      ctx_(ctx),
      rank_(dp.rank()),
      size_(dp.size()) {
  if (o.zero < 0 || o.zero > 3) fail("--zero must be 0, 1, 2 or 3 (got %d)", o.zero);
  if (o.bucket_bytes == 0) fail("the gradient bucket size must be positive");
  MT_CHECK(store.finalized() && store.master(), "DataParallel needs a finalized store holding the full master");
  MT_CHECK(store.shard_multiple() % size_ == 0, "store padded for %d shards, dp has %d ranks", store.shard_multiple(),
           size_);
  MT_CHECK(store.full_grads() == (o.zero < 2) && store.full_compute() == (o.zero < 3),
           "ZeRO-%d needs %s storage", o.zero, storage_name(o.zero));
  if (device_comm) {
    MT_CHECK(device_comm->size() == size_ && device_comm->rank() == rank_,
             "DataParallel: the device communicator (%d of %d) does not match dp (%d of %d)", device_comm->rank(),
             device_comm->size(), rank_, size_);
    MT_CHECK(device_comm->device() == ctx.device, "DataParallel: the device communicator works on %s, the ops on %s",
             device_name(device_comm->device()), device_name(ctx.device));
  }
  // On a device every collective on gradients or parameters needs a device communicator (a host one
  // would read device pointers); one rank at ZeRO-0 communicates nothing.
  if (ctx.device != Device::cpu && tc_.device() != ctx.device && (size_ > 1 || o.zero != 0))
    fail("--device %s with dp=%d and --zero %d needs NCCL for its collectives, and this build has none "
         "(configure on a machine with nccl.h and libnccl)",
         device_name(ctx.device), size_, o.zero);
  MT_CHECK(arena.device() == ctx.device, "DataParallel: the arena's memory (%s) is not the ops' device (%s)",
           device_name(arena.device()), device_name(ctx.device));
  const int U = store.num_units();
  shard_offsets_.resize(size_t(U));
  if (o.zero == 0) {
    segments_ = {Segment{0, store.total_numel()}};
    for (int u = 0; u < U; u++) shard_offsets_[size_t(u)] = store.units()[size_t(u)].begin;
    shard_numel_ = store.total_numel();
    master_shard_ = store.master();
    grad_shard_ = store.grads();
  } else {
    for (int u = 0; u < U; u++) {
      const int64_t cs = chunk_size(u);
      const int64_t b = store.units()[size_t(u)].begin + rank_ * cs;
      segments_.push_back(Segment{b, b + cs});
      shard_offsets_[size_t(u)] = shard_numel_;
      shard_numel_ += cs;
    }
    master_buf_ = arena.alloc(MemCategory::params, size_t(shard_numel_) * 4);
    grad_shard_buf_ = arena.alloc(MemCategory::grads, size_t(shard_numel_) * 4);
    master_shard_ = master_buf_.f32();
    grad_shard_ = grad_shard_buf_.f32();
    take_shard(store.master(), master_shard_);
    if (o.zero >= 2) unit_grads_.resize(size_t(U));
    if (o.zero == 3) {
      // In fp32 the compute shard is the master shard itself (16 bytes per parameter over dp); in
      // bf16/fp16 a 16-bit copy of it (18), which is what the gathers move.
      if (store.compute_dtype() != DType::f32)
        compute_shard_buf_ = arena.alloc(MemCategory::params, store.compute_bytes(shard_numel_));
      compute_shard_ = store.compute_dtype() == DType::f32 ? static_cast<void*>(master_shard_)
                                                           : compute_shard_buf_.data();
      unit_params_.resize(size_t(U));
      gathers_.resize(size_t(U));
    }
    store.release_master();
  }
  local_sq_buf_ = arena.alloc(MemCategory::comm, sizeof(double));
  publish_params();
}

DataParallel::~DataParallel() = default;

int64_t DataParallel::chunk_size(int u) const { return store_.units()[size_t(u)].size() / size_; }
int64_t DataParallel::shard_offset(int u) const { return shard_offsets_[size_t(u)]; }

void DataParallel::begin_step() {
  MT_CHECK(pending_.empty(), "begin_step with reductions still in flight");
  if (store_.full_grads()) store_.zero_grads();
  micros_ = 0;
  if (o_.zero >= 1) arena_.mem().zero(grad_shard_, size_t(shard_numel_) * 4);
  stats_ = DataParallelStats();
  local_sq_noted_ = false;
  last_micro_ = true;
  bucket_begin_ = bucket_end_ = -1;
  handed_.assign(size_t(store_.num_units()), 0);
  staged_rows_.clear();
}

bool DataParallel::wants_row_grads(int u) {
  return o_.embedding_rows && u == 0 && last_micro_ && o_.zero <= 2 && size_ > 1 && ctx_.device == Device::cpu;
}

void DataParallel::add_row_grads(int u, const std::vector<RowGrads>& rows) {
  for (const RowGrads& g : rows) {
    StagedRows s;
    s.unit = u;
    s.entry = g.entry;
    s.n = g.n;
    s.width = g.width;
    s.rows.assign(g.rows, g.rows + g.n);
    s.values.assign(g.values, g.values + g.n * g.width);
    staged_rows_.push_back(std::move(s));
  }
  poll();
}

void DataParallel::apply_row_grads() {
  for (StagedRows& s : staged_rows_) {
    std::vector<int32_t> rows(size_t(s.n) * size_t(size_));
    std::vector<float> values(size_t(s.n * s.width) * size_t(size_));
    dp_.all_gather(s.rows.data(), rows.data(), size_t(s.n), DType::i32);
    dp_.all_gather(s.values.data(), values.data(), size_t(s.n * s.width), DType::f32);
    const ParamEntry& e = store_.entry(s.entry);
    // Where this rank keeps the entry's reduced gradient: everything (stages 0-1) or its chunk.
    int64_t lo = 0, hi = store_.total_numel();
    float* base = store_.grads();
    if (o_.zero == 2) {
      lo = segments_[size_t(s.unit)].begin;
      hi = segments_[size_t(s.unit)].end;
      base = grad_shard_ + shard_offset(s.unit) - lo;
    }
    for (int64_t i = 0; i < s.n * size_; i++) {  // rank order, then row order: deterministic
      const int64_t f0 = e.offset + int64_t(rows[size_t(i)]) * s.width;
      const int64_t a = std::max(f0, lo), b = std::min(f0 + s.width, hi);
      const float* v = values.data() + i * s.width - f0;
      for (int64_t f = a; f < b; f++) base[f] += v[f];
    }
  }
  staged_rows_.clear();
}

void DataParallel::poll() {
  const auto t0 = clock_type::now();
  while (!pending_.empty() && pending_.front().handle.test()) {
    complete(pending_.front());
    pending_.pop_front();
  }
  stats_.grad_poll_s += since(t0);
}

void DataParallel::complete(Pending& p) {
  if (p.unit >= 0) {  // stage 3: accumulate this micro-batch's reduced chunk into the shard
    float* dst = grad_shard_ + shard_offset(p.unit);
    ops::add(dst, dst, p.chunk.f32(), chunk_size(p.unit), ctx_);
  }
  p.grads.reset();
  p.chunk.reset();
}

void DataParallel::flush_bucket() {
  if (bucket_begin_ < 0) return;
  Pending p;
  float* grads = store_.grads_settled(bucket_begin_, bucket_end_);  // the entries backward has not written: zeroed
  p.handle = tc_.all_reduce_async(grads + bucket_begin_, size_t(bucket_end_ - bucket_begin_), DType::f32,
                                  ReduceOp::sum);
  pending_.push_back(std::move(p));
  stats_.reductions++;
  bucket_begin_ = bucket_end_ = -1;
}

void DataParallel::note_local_gradient(int u) {
  // This rank's own gradient, before it is summed with the others' (for the gradient noise scale);
  // a unit whose gradient is completed by rows later is left out, consistently on both sides.
  if (wants_row_grads(u))
    stats_.local_grad_sq_first_unit = u + 1;
  else {
    double* sq = static_cast<double*>(local_sq_buf_.data());
    if (counted_.empty()) {
      ops::sum_squares_into(sq, store_.unit_grads(u), store_.units()[size_t(u)].size(), local_sq_noted_, ctx_);
      local_sq_noted_ = true;
    } else {
      for (size_t i = 0; i < counted_.size(); i++) {
        const ParamEntry& e = store_.entry(int(i));
        if (e.unit != u || !counted_[i]) continue;
        ops::sum_squares_into(sq, store_.grad(int(i)), e.numel, local_sq_noted_, ctx_);
        local_sq_noted_ = true;
      }
    }
  }
  stats_.local_grad_sq_valid = true;
}

double DataParallel::local_grad_sq() const {
  if (!local_sq_noted_) return 0;
  double s = 0;
  // Written by kernels on the compute stream: the download waits for them (MemOps::download, under
  // the arena's DeviceWait), not for the whole device.
  arena_.mem().download(&s, local_sq_buf_.data(), sizeof(s));
  return s;
}

void DataParallel::grads_ready(int u) {
  poll();
  const ParamUnit& unit = store_.units()[size_t(u)];
  if (o_.zero >= 2) {
    // The unit's gradient buffer lives only until its reduce-scatter lands in the shard.
    if (last_micro_ && micros_ == 1 && o_.zero == 2) note_local_gradient(u);  // the whole local gradient
    Pending p;
    p.unit = u;
    p.grads = std::move(unit_grads_[size_t(u)]);
    p.chunk = arena_.alloc(MemCategory::comm, size_t(chunk_size(u)) * 4);
    store_.set_unit_grads(u, nullptr);
    p.handle = tc_.reduce_scatter_async(p.grads.f32(), p.chunk.f32(), size_t(chunk_size(u)), DType::f32, ReduceOp::sum);
    pending_.push_back(std::move(p));
    stats_.reductions++;
    // Each reduction in flight holds a whole unit's gradient buffer: bound how many, so ZeRO-3's
    // memory stays O(a few units) however slow the network is (FSDP rate-limits the same way).
    const auto t0 = clock_type::now();
    while (pending_.size() > kMaxReductionsInFlight) {
      pending_.front().handle.wait();
      complete(pending_.front());
      pending_.pop_front();
    }
    stats_.grad_wait_s += since(t0);
    return;
  }
  if (!last_micro_) return;  // earlier micro-batches only accumulate locally
  handed_[size_t(u)] = 1;
  if (size_ > 1) note_local_gradient(u);  // the noise scale from per-rank norms needs several ranks
  // Stages 0-1: units become final from the top of the flat buffer down (the embeddings may come
  // first, on their own); a bucket is a contiguous range grown downwards.
  if (bucket_begin_ >= 0 && unit.end != bucket_begin_) flush_bucket();
  if (bucket_begin_ < 0) {
    bucket_begin_ = unit.begin;
    bucket_end_ = unit.end;
  } else {
    bucket_begin_ = unit.begin;
  }
  const bool below_done = u == 0 || handed_[size_t(u - 1)];
  if (size_t(bucket_end_ - bucket_begin_) * 4 >= o_.bucket_bytes || below_done) flush_bucket();
}

void DataParallel::finish_grads() {
  // Entries no micro-batch wrote (an expert that got no rows) are zeroed now: from here on the
  // gradient is read through grad_shard_ as well, which does not zero them.
  if (store_.full_grads()) store_.settle_grads();
  flush_bucket();
  const auto t0 = clock_type::now();
  for (Pending& p : pending_) {
    p.handle.wait();
    complete(p);
  }
  pending_.clear();
  apply_row_grads();
  stats_.grad_wait_s += since(t0);
  if (o_.zero == 1)
    for (size_t u = 0; u < segments_.size(); u++)
      arena_.mem().move(grad_shard_ + shard_offsets_[u], store_.grads() + segments_[u].begin,
                        size_t(segments_[u].size()) * 4);
}

double DataParallel::grad_sum_squares(int first_unit) {
  if (first_unit >= store_.num_units()) return 0;
  if (o_.zero == 0) {
    const int64_t b = store_.units()[size_t(first_unit)].begin;
    return ops::sum_squares(store_.grads() + b, store_.total_numel() - b, ctx_);
  }
  const int64_t b = shard_offset(first_unit);
  return all_reduce_sum_double(dp_, ops::sum_squares(grad_shard_ + b, shard_numel_ - b, ctx_));
}

double DataParallel::grad_sum_squares(const std::vector<char>& counted) {
  MT_CHECK(counted.size() == store_.entries().size(), "grad_sum_squares: one flag per entry expected");
  double sum = 0;  // pieces in shard order: deterministic
  int64_t shard_pos = 0;
  for (const Segment& seg : segments_) {
    for (size_t i = 0; i < counted.size(); i++) {
      const ParamEntry& e = store_.entry(int(i));
      const int64_t lo = std::max(seg.begin, e.offset), hi = std::min(seg.end, e.offset + e.numel);
      if (counted[i] && hi > lo) sum += ops::sum_squares(grad_shard_ + shard_pos + (lo - seg.begin), hi - lo, ctx_);
    }
    shard_pos += seg.size();
  }
  return o_.zero == 0 ? sum : all_reduce_sum_double(dp_, sum);
}

void DataParallel::grad_sum_squares_into(double* out) {
  MT_CHECK(grad_norm_is_local(), "grad_sum_squares_into: the gradient is sharded over %d ranks", size_);
  if (o_.zero == 0)
    ops::sum_squares_into(out, store_.grads(), store_.total_numel(), false, ctx_);
  else
    ops::sum_squares_into(out, grad_shard_, shard_numel_, false, ctx_);
}

bool DataParallel::grads_finite() {
  int32_t bad = ops::all_finite(grad_shard_, shard_numel_, ctx_) ? 0 : 1;
  if (o_.zero >= 1) dp_.all_reduce(&bad, 1, DType::i32, ReduceOp::max);
  return bad == 0;
}


void DataParallel::to_compute(void* dst, const float* src, int64_t n) {
  switch (store_.compute_dtype()) {
    case DType::bf16: return ops::convert(static_cast<bf16*>(dst), src, n, ctx_);
    case DType::f16: return ops::convert(static_cast<f16*>(dst), src, n, ctx_);
    default: return arena_.mem().move(dst, src, size_t(n) * 4);
  }
}

void DataParallel::publish_params() {
  const DType t = store_.compute_dtype();
  if (o_.zero == 0) {
    store_.refresh_compute();
    return;
  }
  if (o_.zero == 3) {
    // Gathered copies (a prefetched unit not yet used) hold the old values: drop them first.
    for (size_t u = 0; u < unit_params_.size(); u++) {
      gathers_[u].wait();
      if (unit_params_[u]) {
        unit_params_[u].reset();
        store_.set_unit_compute(int(u), nullptr);
      }
    }
    last_acquired_ = -1;
    if (compute_shard_ != master_shard_) to_compute(compute_shard_, master_shard_, shard_numel_);
    return;
  }
  std::vector<CommHandle> hs;
  for (int u = 0; u < store_.num_units(); u++) {
    const int64_t cs = chunk_size(u);
    void* mine = static_cast<char*>(store_.unit_compute(u)) + store_.compute_bytes(rank_ * cs);
    to_compute(mine, master_shard_ + shard_offset(u), cs);
    hs.push_back(tc_.all_gather_async(mine, store_.unit_compute(u), size_t(cs), t));  // in place
  }
  for (CommHandle& h : hs) h.wait();
}

void DataParallel::start_gather(int u) {
  unit_params_[size_t(u)] =
      arena_.alloc(MemCategory::params, store_.compute_bytes(store_.units()[size_t(u)].size()));
  gathers_[size_t(u)] =
      tc_.all_gather_async(static_cast<char*>(compute_shard_) + store_.compute_bytes(shard_offset(u)),
                           unit_params_[size_t(u)].data(), size_t(chunk_size(u)), store_.compute_dtype());
}

void DataParallel::acquire(int u, bool with_grads) {
  poll();
  const size_t k = size_t(u);
  if (o_.zero >= 2 && with_grads && !unit_grads_[k]) {
    unit_grads_[k] = arena_.alloc(MemCategory::grads, size_t(store_.units()[k].size()) * 4);  // zero-filled
    store_.set_unit_grads(u, unit_grads_[k].f32());
  }
  if (o_.zero != 3) return;
  if (!unit_params_[k]) start_gather(u);
  const auto t0 = clock_type::now();
  gathers_[k].wait();
  stats_.gather_wait_s += since(t0);
  store_.set_unit_compute(u, unit_params_[k].data());
  // Prefetch the unit that comes next when units are walked in order (forward up, backward down).
  const int step = u - last_acquired_;
  const int next = u + step;
  if ((step == 1 || step == -1) && next >= 0 && next < store_.num_units() && !unit_params_[size_t(next)])
    start_gather(next);
  last_acquired_ = u;
}

void DataParallel::release(int u) {
  if (o_.zero != 3) return;
  const size_t k = size_t(u);
  gathers_[k].wait();
  unit_params_[k].reset();
  store_.set_unit_compute(u, nullptr);
}

void DataParallel::gather_full(const float* shard, float* full) {
  if (o_.zero == 0) {
    arena_.mem().download(full, shard, size_t(shard_numel_) * 4);
    return;
  }
  if (arena_.device() == Device::cpu) {
    for (int u = 0; u < store_.num_units(); u++)
      dp_.all_gather(shard + shard_offset(u), full + store_.units()[size_t(u)].begin, size_t(chunk_size(u)),
                     DType::f32);
    return;
  }
  // On a device: gather on the device, then one download.
  Buffer whole = arena_.alloc(MemCategory::comm, size_t(store_.total_numel()) * 4);
  for (int u = 0; u < store_.num_units(); u++)
    tc_.all_gather(shard + shard_offset(u), whole.f32() + store_.units()[size_t(u)].begin, size_t(chunk_size(u)),
                   DType::f32);
  arena_.mem().download(full, whole.f32(), size_t(store_.total_numel()) * 4);
}

void DataParallel::take_shard(const float* full, float* shard) const {
  if (o_.zero == 0) {
    arena_.mem().move(shard, full, size_t(shard_numel_) * 4);
    return;
  }
  for (size_t u = 0; u < segments_.size(); u++)
    arena_.mem().move(shard + shard_offsets_[u], full + segments_[u].begin, size_t(segments_[u].size()) * 4);
}

}  // namespace mt::parallel
