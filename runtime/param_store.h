// ParamStore: every model parameter lives in flat buffers, so optimizers, ZeRO sharding and
// checkpoints work on contiguous ranges and never need to know the model.
//
//   master   fp32 weights the optimizer updates                                     (params)
//   compute  the copy forward/backward read, in the run's compute dtype: the master rounded to
//            bf16/fp16 (2 bytes per parameter); in fp32 runs the master buffer itself (params)
//   grads    fp32 gradients, accumulated (+=) over micro-batches                     (grads)
//
// Parameters are grouped into UNITS (the embeddings, each transformer layer, the final norm): the
// granularity at which data parallelism reduces gradients and ZeRO-3 gathers and frees parameters.
// A unit is a contiguous range of the flat index space, padded so that its length is a multiple of
// 16 x shard_multiple: each of `shard_multiple` equal chunks then starts on a 64-byte boundary (the
// chunk r of every unit is what data-parallel rank r owns under ZeRO, as in PyTorch FSDP's flat
// parameters). Each entry starts on a 16-element boundary within its unit.
//
// Storage is full by default. A sharding engine (parallel/data_parallel.h) may instead keep the
// gradients (ZeRO-2), or the compute parameters and the gradients (ZeRO-3), per unit — materialised
// only while a unit is in use (set_unit_compute / set_unit_grads) — and drop the full master once it
// holds its shard (release_master).
//
// The name -> (offset, shape, global slice) table is what a checkpoint stores, so a tensor sharded by
// a parallel layout can be reassembled under another one.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>


#include "runtime/arena.h"
#include "runtime/box.h"
#include "runtime/check.h"
#include "runtime/dtype.h"
#include "runtime/storage.h"

namespace mt {

// Bits of ParamEntry::replicated and ::partial_grad, one per mesh dimension (parallel::MeshDim order).
enum : uint8_t { kAxisTp = 1, kAxisCp = 2, kAxisPp = 4, kAxisDp = 8 };

struct ParamEntry {
  std::string name;
  std::vector<int64_t> shape;          // local shape, as the model computes with it
  std::vector<int64_t> global_shape;   // shape of the whole tensor across ranks (checkpoints, exports)
  ParamBox box;                        // the part of it this rank holds (the whole tensor by default)
  int64_t offset = 0;                  // element offset into the flat buffers
  int64_t numel = 0;
  int unit = 0;
  bool weight_decay = true;
  // Mesh dimensions (kAxis* bits) along which every rank holds this same box: a replica, to be counted
  // once in norms and written once in checkpoints. Data parallelism is not recorded here: its replicas
  // and ZeRO shards are the sharding engine's business (parallel/data_parallel.h).
  uint8_t replicated = 0;
  // Dimensions along which each rank's gradient is only a partial sum (a LayerNorm under sequence
  // parallelism sees T/tp of the tokens): summed over that group before the gradient is used.
  uint8_t partial_grad = 0;
};

// The same for a parameter's local elements (its box).
template <class F>
void for_each_global_run(const ParamEntry& e, int64_t local_begin, int64_t local_end, F f) {
  for_each_box_run(e.box, local_begin, local_end, f);
}

struct ParamUnit {
  std::string name;
  int64_t begin = 0, end = 0;  // padded flat range [begin, end)
  int64_t size() const { return end - begin; }
};

enum class Storage {
  full,            // master, compute and grads in full
  per_unit_grads,  // full master and compute; gradients per unit (ZeRO-2)
  per_unit,        // full master only (for initialisation); compute and gradients per unit (ZeRO-3)
};

class ParamStore {
 public:
  ParamStore() = default;
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Starts a new unit; parameters added after belong to it. A store without explicit units has one.
  void begin_unit(const std::string& name);
  // Registers a parameter in the current unit; returns its index. Only before finalize().
  int add(const std::string& name, std::vector<int64_t> shape, bool weight_decay);
  // Registers this rank's part of a split parameter: `shape` is the local shape (numel = box's),
  // `global_shape` the whole tensor's, `box` where the part lies (in a space of the same numel).
  int add_part(const std::string& name, std::vector<int64_t> shape, std::vector<int64_t> global_shape, ParamBox box,
               bool weight_decay, uint8_t replicated = 0, uint8_t partial_grad = 0);
  // Lays out the units (each padded to a multiple of 16 x shard_multiple) and allocates (zeroed) from
  // `arena` the full master and, per `storage`, the full compute copy and gradients. The buffers live
  // where the arena's memory does (mem()); refresh_compute and zero_grads work there.
  void finalize(Arena& arena, DType compute_dtype, int shard_multiple = 1, Storage storage = Storage::full);

  bool finalized() const { return finalized_; }
  int64_t total_numel() const { return total_; }  // padded length of the flat buffers
  int64_t param_count() const;                    // sum of numel (unpadded)
  DType compute_dtype() const { return compute_dtype_; }
  int shard_multiple() const { return shard_multiple_; }
  const MemOps& mem() const { return mem_; }  // the memory of the buffers (host before finalize)
  const std::vector<ParamEntry>& entries() const { return entries_; }
  const ParamEntry& entry(int i) const { return entries_[size_t(i)]; }
  const ParamEntry* find(const std::string& name) const;  // nullptr if absent
  const std::vector<ParamUnit>& units() const { return units_; }
  int num_units() const { return int(units_.size()); }
  bool full_compute() const { return storage_ != Storage::per_unit; }
  bool full_grads() const { return storage_ == Storage::full; }
  bool full_storage() const { return storage_ == Storage::full; }

  // Full buffers (nullptr when not held: per-unit compute/grads, master once released). The compute
  // copy holds compute_dtype() elements (fp32: the master's buffer). grads() zeroes the entries still
  // waiting for their first write first (see zero_grads), so its reader sees the step's gradient.
  float* master() const { return master_.f32(); }
  void* compute() const { return full_compute() ? (compute_ ? compute_.data() : master_.data()) : nullptr; }
  float* grads() const;
  // The full gradient buffer with only the entries meeting [begin, end) zeroed if still waiting: a
  // reduction of that range while backward goes on writing the others.
  float* grads_settled(int64_t begin, int64_t end) const;
  float* master(int i) const;
  // Pointers into the unit's current buffers; fail if the unit is not materialised. compute_as<S>
  // also fails unless S is the compute dtype.
  template <class S>
  S* compute_as(int i) const {
    MT_CHECK(dtype_of<S>() == compute_dtype_, "compute weights are %s, read as %s", dtype_name(compute_dtype_),
             dtype_name(dtype_of<S>()));
    return static_cast<S*>(compute_entry(i));
  }
  // Entry i's gradient, for a writer that adds to it (zeroed first if it still waits for its first
  // write).
  float* grad(int i) const;
  // Entry i's gradient for a writer that will set all n of its elements, as a weight gradient's GEMM
  // does: *assign tells it whether to write over the buffer (the step's first contribution, whose old
  // contents are stale, so nothing needs zeroing or reading: GEMM beta = 0) or to add to it. n other
  // than the entry's numel gets the buffer zeroed and assign = false, as grad(i) does.
  float* grad_for_write(int i, int64_t n, bool* assign);
  void* unit_compute(int u) const { return unit_compute_[size_t(u)]; }
  float* unit_grads(int u) const;  // zeroes the unit's entries still waiting, as grad() does
  size_t compute_bytes(int64_t n) const { return size_t(n) * dtype_size(compute_dtype_); }
  // Per-unit storage: points unit u's compute (or grads) at a caller-owned buffer of units()[u].size()
  // elements (nullptr: not materialised).
  void set_unit_compute(int u, void* compute);
  void set_unit_grads(int u, float* grads);
  void release_master();
  // True while the fp32 compute weights are the master's own buffer (full storage, master held).
  bool compute_aliases_master() const;

  // compute = master rounded to the compute dtype (full storage only).
  void refresh_compute();
  // The step's gradients start from zero (full storage only; per-unit grads are zeroed by their
  // owner). Nothing is written here: each entry waits for its first write (grad_for_write assigns it;
  // grad, unit_grads and grads zero it first), so a weight gradient's GEMM writes its buffer once
  // instead of zeroing it in one pass and reading it back in another. Padding stays zero throughout:
  // no writer touches it.
  void zero_grads();
  // Zeroes now every entry still waiting for its first write.
  void settle_grads() const;

 private:
  std::vector<ParamEntry> entries_;
  std::vector<ParamUnit> units_;
  std::unordered_map<std::string, int> index_;
  void* compute_entry(int i) const;
  std::vector<void*> unit_compute_;
  std::vector<float*> unit_grads_;
  int64_t total_ = 0;
  int shard_multiple_ = 1;
  bool finalized_ = false;
  Storage storage_ = Storage::full;
  DType compute_dtype_ = DType::f32;
  MemOps mem_ = host_memory();
  Buffer master_, compute_, grads_;
  // Per entry: its gradient waits for the step's first write (full storage only). Zeroing on first
  // use is the buffer's state, not the reader's, hence mutable: a const accessor may settle it.
  mutable std::vector<uint8_t> waiting_;
  mutable int64_t num_waiting_ = 0;
  void settle(int i) const;
};

// How a model tells the owner of the parameters when it uses each unit. Data parallelism implements
// it (parallel/data_parallel.h) to reduce gradients as soon as a unit's are final and, under ZeRO-3,
// to gather a unit's parameters just before use and free them after. Without hooks every unit is
// always materialised and nothing is communicated.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // Unit u's parameters (and, if with_grads, its gradient buffer) are about to be used.
  virtual void acquire(int u, bool with_grads) = 0;
  // Unit u's parameters are not needed until the next acquire.
  virtual void release(int u) = 0;
  // This micro-batch's gradient contributions to unit u are all accumulated.
  virtual void grads_ready(int u) = 0;

  // Row contributions to a parameter's gradient: grad[rows[i], :] += values[i, :] for i < n (the
  // backward of an embedding lookup).
  struct RowGrads {
    int entry = -1;
    const int32_t* rows = nullptr;
    const float* values = nullptr;  // (n, width)
    int64_t n = 0, width = 0;
  };
  // When true, the model reports unit u ready as soon as its dense contributions are in (for a tied
  // embedding: right after the classifier, at the start of backward) and hands the rest, the
  // embedding's sparse backward, through add_row_grads. This lets the large embedding gradient be
  // reduced while backward runs instead of after it.
  virtual bool wants_row_grads(int u) {
    (void)u;
    return false;
  }
  virtual void add_row_grads(int u, const std::vector<RowGrads>& rows) {
    (void)u;
    (void)rows;
  }
};

}  // namespace mt
