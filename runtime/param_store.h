// ParamStore: every model parameter lives in three flat buffers, so optimizers, ZeRO sharding and
// checkpoints work on contiguous ranges and never need to know the model.
//
//   master   fp32 weights the optimizer updates            (category params)
//   compute  the copy forward/backward read: on the CPU backend fp32 storage holding values rounded
//            to the run's precision (bf16/fp16), identical to master in fp32 runs   (category params)
//   grads    fp32 gradients, accumulated (+=) over micro-batches                    (category grads)
//
// A name -> (offset, shape, global slice) table describes the buffers. Each entry starts on a
// 64-byte boundary. The global shape/slice is what a checkpoint stores, so a tensor sharded by a
// parallel layout can be reassembled under another one.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/arena.h"
#include "runtime/dtype.h"

namespace mt {

struct ParamEntry {
  std::string name;
  std::vector<int64_t> shape;         // local shape
  std::vector<int64_t> global_shape;  // shape of the whole tensor across ranks
  std::vector<int64_t> global_offset; // where this local slice starts in the global tensor
  int64_t offset = 0;                 // element offset into the flat buffers
  int64_t numel = 0;
  bool weight_decay = true;           // matrices decay; biases, norms and embeddings' positions too? see model
};

class ParamStore {
 public:
  ParamStore() = default;
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Registers a parameter; returns its index. Only before finalize().
  int add(const std::string& name, std::vector<int64_t> shape, bool weight_decay);
  // Allocates the three buffers (zeroed) from `arena`; `compute_dtype` is the run's precision.
  void finalize(Arena& arena, DType compute_dtype);

  bool finalized() const { return finalized_; }
  int64_t total_numel() const { return total_; }      // padded length of the flat buffers
  int64_t param_count() const;                         // sum of numel (unpadded)
  DType compute_dtype() const { return compute_dtype_; }
  const std::vector<ParamEntry>& entries() const { return entries_; }
  const ParamEntry& entry(int i) const { return entries_[size_t(i)]; }
  const ParamEntry* find(const std::string& name) const;  // nullptr if absent

  float* master() const { return master_.f32(); }
  float* compute() const { return compute_.f32(); }
  float* grads() const { return grads_.f32(); }
  float* master(int i) const { return master() + entries_[size_t(i)].offset; }
  float* compute(int i) const { return compute() + entries_[size_t(i)].offset; }
  float* grad(int i) const { return grads() + entries_[size_t(i)].offset; }

  // compute = round(master) in the compute dtype.
  void refresh_compute();
  void zero_grads();

 private:
  std::vector<ParamEntry> entries_;
  std::unordered_map<std::string, int> index_;
  int64_t total_ = 0;
  bool finalized_ = false;
  DType compute_dtype_ = DType::f32;
  Buffer master_, compute_, grads_;
};

// Rounds n floats in place to `t` (no-op for f32).
void round_inplace(float* x, int64_t n, DType t);

}  // namespace mt
