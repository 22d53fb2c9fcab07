// Tensor parallelism with sequence parallelism (Megatron-LM: Shoeybi et al. 2019, "Megatron-LM";
// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models").
//
// A transformer layer's matrices are split over the tp ranks so that each pair of GEMMs needs one
// collective in each direction:
//   column-parallel  c_attn (whole heads per rank) and c_fc: each rank computes its slice of the
//                    output features from the whole input;
//   row-parallel     attn.c_proj and mlp.c_proj: each rank multiplies its slice of the input features
//                    and the partial products are summed over tp (the bias added on one rank only);
//   vocabulary       wte split by rows: the embedding looks up only its rows (other ids give zero)
//                    and the classifier computes its columns of the logits; cross-entropy merges the
//                    ranks' partial softmax statistics (kernels/ops.h xent_slice_*), so the full
//                    (N, Vp) logits never exist anywhere.
// Everything else (LayerNorms, position embedding, the row-parallel biases) is replicated.
//
// Sequence parallelism (sp): between the row-parallel sum and the next column-parallel GEMM (the
// residual stream, the LayerNorms) each rank holds N / tp of the N = B T rows, so the sum becomes a
// reduce-scatter and the column-parallel input an all-gather (forward; their conjugates in backward):
// the same bytes as the all-reduce it replaces, and 1/tp of the residual-stream activations. The
// replicated LayerNorms and the position embedding then see N / tp rows each, so their gradients are
// partial sums over tp (ParamEntry::partial_grad), summed before data parallelism reduces them.
// Without sp every rank holds all N rows, the sum is an all-reduce and no gradient is partial.
//
// This file holds what the model composes: the split arithmetic, the sequence collectives on
// activations, and TensorParallelGrads, the UnitHooks that sum partial gradients over tp in front
// of data parallelism.
#pragma once
#include <cstdint>
#include <vector>

#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "runtime/param_store.h"
#include "runtime/storage.h"

namespace mt::parallel {

class TensorParallel {
 public:
  TensorParallel() = default;  // no tensor parallelism: one rank
  // `tp`: the tensor-parallel communicator on the host (scalars: norms, flags); `data`: the one the
  // activations and gradients travel on, over the same ranks (an NcclComm over `tp` on GPUs; nullptr:
  // `tp` itself, the CPU backend). sp: sequence parallelism.
  TensorParallel(Comm& tp, bool sp, Comm* data = nullptr);

  int size() const { return size_; }
  int rank() const { return rank_; }
  bool active() const { return size_ > 1; }
  // True when the residual stream is split over the ranks (sp with more than one rank).
  bool splits_sequence() const { return sp_ && size_ > 1; }
  Comm& comm() const;       // host scalars
  Comm& data_comm() const;  // tensors, where the model's buffers live

  // The box of this rank's part when dimension `dim` of `space` is split into size() equal parts.
  ParamBox split(std::vector<int64_t> space, int dim) const;
  // Rows of the N-row residual stream this rank holds.
  int64_t own_rows(int64_t N) const { return splits_sequence() ? N / size_ : N; }
  // The first of them.
  int64_t first_row(int64_t N) const { return splits_sequence() ? rank_ * (N / size_) : 0; }

  // Sequence collectives on (rows, C) activations of storage type S (reductions in fp32, one rounding;
  // parallel/comm.h). gather: all N rows from each rank's own rows (sp only). sum_scatter: the sum
  // over ranks of `partial` (N rows); sp: each rank receives its own rows into `own`; otherwise an
  // all-reduce in place (own == partial). Not called with one rank.
  template <class S>
  void gather(S* full, const S* own, int64_t own_rows, int64_t C) const {
    data_comm().all_gather(own, full, size_t(own_rows * C), dtype_of<S>());
  }
  template <class S>
  void sum_scatter(S* own, S* partial, int64_t own_rows, int64_t C) const {
    if (splits_sequence())
      data_comm().reduce_scatter(partial, own, size_t(own_rows * C), dtype_of<S>(), ReduceOp::sum);
    else
      data_comm().all_reduce(own, size_t(own_rows * C), dtype_of<S>(), ReduceOp::sum);
  }

 private:
  Comm* comm_ = nullptr;
  Comm* data_ = nullptr;
  int size_ = 1, rank_ = 0;
  bool sp_ = false;
};

// The hooks the model calls, in front of data parallelism: before a unit's gradient is reduced over
// dp, its entries whose gradient is partial over tp are summed over tp (fp32, rank order: the same
// bits on every rank). Reductions happen exactly when data parallelism reduces (its last micro-batch,
// or every micro-batch at ZeRO-2/3), so accumulation over micro-batches is summed once.
class TensorParallelGrads final : public UnitHooks {
 public:
  // `dp` must have been built with embedding_rows off.
  TensorParallelGrads(ParamStore& store, const TensorParallel& tp, DataParallel& dp);

  void acquire(int u, bool with_grads) override { dp_.acquire(u, with_grads); }
  void release(int u) override { dp_.release(u); }
  void grads_ready(int u) override;
  // The embeddings' row gradients would need ids remapped to each rank's vocabulary rows: the data
  // parallelism behind these hooks runs with DataParallelOptions::embedding_rows off.
  bool wants_row_grads(int u) override { return dp_.wants_row_grads(u); }

 private:
  ParamStore& store_;
  const TensorParallel& tp_;
  DataParallel& dp_;
  // Per unit: the flat ranges of its entries with a partial gradient over tp, adjacent entries
  // merged (a LayerNorm's weight and bias are one range: one all-reduce).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> partial_;
};

}  // namespace mt::parallel
