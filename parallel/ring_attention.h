// Context parallelism: each sequence is split over the cp ranks, and causal attention runs as ring
// attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers") with the zigzag layout
// that balances its work (Megatron-LM's and PyTorch's context parallelism; Brandon et al. 2023,
// "Striped Attention", make the same argument).
//
// Who holds what. A sequence of T tokens is cut into 2C chunks of T/(2C) (C = cp ranks); rank r holds
// chunks r and 2C-1-r, in that order, as its T/C local rows. Under causality a query in chunk c sees
// chunks 0..c, so a contiguous split would give the last rank C times the work of the first; the
// zigzag pairs an early chunk with a late one and every rank does the same work (item 5 of the issue:
// the figure is for later). Positions stay global: the embedding adds the global position's row, and
// the attention mask compares global positions and document ids (Zigzag::position).
//
// The ring. Every rank holds its queries and its key/value block (B, T/C, 2C of the model width). Over
// C steps the key/value blocks travel the ring (rank r sends to r+1 and receives from r-1; the block
// in hand at step s is rank (r - s)'s), the next block's transfer in flight while the block in hand is
// computed (ops::flash_block_fwd); each step's partial output and log-sum-exp are merged into an fp32
// accumulator (ops::attention_merge), and rounded to the storage type once at the end. A block pair that
// causality or the document mask hides entirely (ops::attention_block_hidden) is skipped; its bytes
// still travel, for the ranks after this one. The document ids travel with their block.
//
// Backward pairs with forward: the key/value blocks travel the same ring again, and with each goes an
// fp32 accumulator of its dK and dV, to which every rank adds its queries' share (ops::flash_block_bwd,
// with the final lse and D = rowsum(dO * O)) before passing it on; after C steps and C sends each
// accumulator is back with the block's owner. dQ stays at home. All sums are fp32; dqkv is rounded once.
//
// On a GPU the key/value blocks and the dK/dV accumulators travel over the cp group's NCCL communicator
// (device buffers from the run's arena, on the communicator's stream: each step one grouped send to
// rank + 1 and receive from rank - 1, ordered after the compute stream's work and before its next by
// events, no host wait), and the block kernels are ops::flash_block_fwd/bwd's CUDA twins. The document
// ids travel the same ring over the host communicator: the host decides which pairs to skip from its
// own copies (its rows' ids come with the batch) and never downloads them; each received block of ids
// is uploaded in stream order for the kernels, and every rank's positions once per call. Deadlock: all
// ranks issue the same exchanges in the same order and each pairs its send with its receive, so the
// k-th exchange of every rank meets the k-th of its two neighbours (parallel/pipeline_exchange.h's
// model, one exchange per step); the backward's two per step (blocks, then gradients) likewise.
//
// Bytes this rank sends per layer (b = the storage type's bytes, N_l = B T/C local rows, W = model
// width of the rank's heads), as the cp group's counters book them (on a GPU the host and the NCCL
// communicator's together):
//   forward   (C-1) N_l 2W b          + (C-1) N_l 4 (document ids, when masked)
//   backward  (C-1) N_l 2W b + C N_l 2W 4 + (C-1) N_l 4
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "parallel/comm.h"

namespace mt::parallel {

// The zigzag layout of a T-token sequence over `cp` ranks, seen from rank `rank`.
struct Zigzag {
  int T = 0, cp = 1, rank = 0;
  // Fails, naming --cp and seq_len, unless T is divisible by 2 cp.
  static void check(int T, int cp);
  int local_len() const { return T / cp; }
  int chunk_len() const { return T / (2 * cp); }
  // The global position (0..T-1) of local row t (0..T/cp-1).
  int position(int t) const {
    const int c = chunk_len();
    return t < c ? rank * c + t : (2 * cp - 1 - rank) * c + (t - c);
  }
  std::vector<int32_t> positions() const;
  // This rank's rows of a (B, T, width) array, as a (B, T/cp, width) one.
  template <class X>
  void take(X* local, const X* full, int B, int64_t width) const;
};

// What one forward or backward did: block pairs computed and skipped (hidden entirely).
struct RingStats {
  int computed = 0, skipped = 0;
};

class RingAttention {
 public:
  RingAttention() = default;  // no context parallelism
  // `cp`: the cp group's host communicator (the document ids travel over it). `scratch`: the arena the
  // ring's buffers come from (counted as activations while a call runs: two key/value blocks and the
  // fp32 accumulators); nullptr: an arena of the call's own (host memory: the CPU backend only).
  // `blocks`: the communicator of the key/value blocks and their gradients, the cp group's NCCL one on
  // a GPU; nullptr: cp.
  explicit RingAttention(Comm& cp, Arena* scratch = nullptr, Comm* blocks = nullptr)
      : comm_(&cp), blocks_(blocks ? blocks : &cp), arena_(scratch) {}
  bool active() const { return comm_ && comm_->size() > 1; }
  int size() const { return comm_ ? comm_->size() : 1; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  Comm& comm() const;

  // Causal (and, with doc, document-masked) attention of this rank's Tl = T/cp zigzag rows against the
  // whole sequence. qkv (B,Tl,3C) [q | k | v], doc (B,Tl) or nullptr, out (B,Tl,C), lse (B,NH,Tl): the
  // same as ops::flash_attention_fwd on the whole sequence, these rows taken. Arrays in ctx's memory;
  // doc_host: the same ids on the host (doc itself on the CPU), nullptr with doc.
  template <class S>
  RingStats forward(S* out, float* lse, const S* qkv, const int32_t* doc, const int32_t* doc_host, int B, int Tl,
                    int C, int NH, const ops::Ctx& ctx) const;
  // dqkv (B,Tl,3C) from dout, qkv, out and lse of the forward (assigned).
  template <class S>
  RingStats backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, const int32_t* doc,
                     const int32_t* doc_host, int B, int Tl, int C, int NH, const ops::Ctx& ctx) const;

 private:
  Comm* comm_ = nullptr;
  Comm* blocks_ = nullptr;
  Arena* arena_ = nullptr;
};

}  // namespace mt::parallel
