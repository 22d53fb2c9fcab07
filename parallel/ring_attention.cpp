// Ring attention over the cp communicator (the layout, the ring and the bytes: ring_attention.h).
#include "parallel/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "runtime/check.h"
#include "runtime/storage.h"

namespace mt::parallel {

void Zigzag::check(int T, int cp) {
  if (cp < 1 || T % (2 * cp) != 0)
    fail("--cp %d: seq_len %d must be divisible by 2 x cp = %d (each sequence is cut into 2 cp chunks)", cp, T,
         2 * cp);
}

std::vector<int32_t> Zigzag::positions() const {
  std::vector<int32_t> p(static_cast<size_t>(local_len()));
  for (int t = 0; t < local_len(); t++) p[size_t(t)] = position(t);
  return p;
}

template <class X>
void Zigzag::take(X* local, const X* full, int B, int64_t width) const {
  const int Tl = local_len();
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tl; t++)
      std::copy_n(full + (int64_t(b) * T + position(t)) * width, width, local + (int64_t(b) * Tl + t) * width);
}
template void Zigzag::take<int32_t>(int32_t*, const int32_t*, int, int64_t) const;
template void Zigzag::take<float>(float*, const float*, int, int64_t) const;
template void Zigzag::take<double>(double*, const double*, int, int64_t) const;
template void Zigzag::take<bf16>(bf16*, const bf16*, int, int64_t) const;
template void Zigzag::take<f16>(f16*, const f16*, int, int64_t) const;

Comm& RingAttention::comm() const {
  MT_CHECK(comm_ != nullptr, "ring attention without a cp communicator");
  return *comm_;
}

namespace {

// Ring attention's buffers: from the run's arena (counted as activations) when it has one, else from an
// arena of their own.
class Scratch {
 public:
  explicit Scratch(Arena* arena) : ar_(arena ? *arena : own_) {}
  template <class T>
  T* take(size_t n) {
    bufs_.push_back(ar_.alloc_uninitialized(MemCategory::activations, n * sizeof(T)));
    return static_cast<T*>(bufs_.back().data());
  }

 private:
  Arena own_;
  Arena& ar_;
  std::vector<Buffer> bufs_;
};

// One rank's key/value block as it travels: (B,Tl,2C) [k | v] in the storage type, and the document
// ids of its rows (nullptr when unmasked).
template <class S>
struct KvBlock {
  S* kv = nullptr;
  int32_t* doc = nullptr;
};

template <class S>
KvBlock<S> block_buffers(Scratch& sc, size_t nkv, size_t ndoc, bool with_doc) {
  return {sc.take<S>(nkv), with_doc ? sc.take<int32_t>(ndoc) : nullptr};
}

// Starts the transfer of `cur` to the next rank and of the previous rank's block into `next`. The
// block in hand is only read while it is being sent.
template <class S>
std::pair<CommHandle, CommHandle> pass_on(Comm& c, const KvBlock<S>& cur, KvBlock<S>& next, size_t nkv, size_t ndoc) {
  const int P = c.size(), to = (c.rank() + 1) % P, from = (c.rank() + P - 1) % P;
  CommHandle kv = c.send_recv_async(cur.kv, nkv, to, next.kv, nkv, from, dtype_of<S>(), 0);
  CommHandle doc;
  if (cur.doc) doc = c.send_recv_async(cur.doc, ndoc, to, next.doc, ndoc, from, DType::i32, 1);
  return {std::move(kv), std::move(doc)};
}

// This rank's own block, copied out of its qkv (B,Tl,3C).
template <class S>
void fill_own(KvBlock<S>& blk, const S* qkv, const int32_t* doc, int B, int Tl, int C) {
  for (int64_t n = 0; n < int64_t(B) * Tl; n++) std::copy_n(qkv + n * 3 * C + C, 2 * C, blk.kv + n * 2 * C);
  if (doc) std::copy_n(doc, int64_t(B) * Tl, blk.doc);
}

}  // namespace

template <class S>
RingStats RingAttention::forward(S* out, float* lse, const S* qkv, const int32_t* doc, int B, int Tl, int C, int NH,
                                 const ops::Ctx& ctx) const {
  Comm& c = comm();
  const int P = c.size(), r = c.rank();
  RingStats st;
  const std::vector<int32_t> q_pos = Zigzag{Tl * P, P, r}.positions();
  const size_t nkv = size_t(B) * Tl * 2 * C, ndoc = size_t(B) * Tl, no = size_t(B) * Tl * C, nl = size_t(B) * NH * Tl;
  Scratch sc(arena_);
  KvBlock<S> cur = block_buffers<S>(sc, nkv, ndoc, doc != nullptr);
  KvBlock<S> next = block_buffers<S>(sc, nkv, ndoc, doc != nullptr);
  fill_own(cur, qkv, doc, B, Tl, C);
  // fp32 accumulators: the merged output and lse, and one block's partial result.
  float *O = sc.take<float>(no), *L = sc.take<float>(nl), *part_o = sc.take<float>(no), *part_l = sc.take<float>(nl);
  std::fill(O, O + no, 0.f);
  std::fill(L, L + nl, -INFINITY);
  for (int s = 0; s < P; s++) {
    const int src = (r - s + P) % P;
    std::pair<CommHandle, CommHandle> flight;
    if (s + 1 < P) flight = pass_on(c, cur, next, nkv, ndoc);
    const std::vector<int32_t> k_pos = Zigzag{Tl * P, P, src}.positions();
    if (ops::attention_block_hidden(q_pos.data(), k_pos.data(), doc, cur.doc, B, Tl, Tl)) {
      st.skipped++;
    } else {
      ops::flash_block_fwd(part_o, part_l, qkv, 3 * C, cur.kv, cur.kv + C, 2 * C, q_pos.data(), k_pos.data(), doc,
                           cur.doc, B, Tl, Tl, C, NH, ctx);
      ops::attention_merge(O, L, part_o, part_l, B, Tl, C, NH, ctx);
      st.computed++;
    }
    flight.first.wait();
    flight.second.wait();
    if (s + 1 < P) std::swap(cur, next);
  }
  ops::convert(out, static_cast<const float*>(O), int64_t(no), ctx);
  std::copy(L, L + nl, lse);
  return st;
}

template <class S>
RingStats RingAttention::backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                                  const int32_t* doc, int B, int Tl, int C, int NH, const ops::Ctx& ctx) const {
  Comm& c = comm();
  const int P = c.size(), r = c.rank(), to = (r + 1) % P, from = (r + P - 1) % P;
  RingStats st;
  const std::vector<int32_t> q_pos = Zigzag{Tl * P, P, r}.positions();
  const size_t nkv = size_t(B) * Tl * 2 * C, ndoc = size_t(B) * Tl, nq = size_t(B) * Tl * C;
  Scratch sc(arena_);
  float *D = sc.take<float>(size_t(B) * NH * Tl), *dq = sc.take<float>(nq), *dkv = sc.take<float>(nkv),
        *dkv_next = sc.take<float>(nkv);
  std::fill(dq, dq + nq, 0.f);
  std::fill(dkv, dkv + nkv, 0.f);
  ops::attention_delta(D, dout, out, B, Tl, C, NH, ctx);
  KvBlock<S> cur = block_buffers<S>(sc, nkv, ndoc, doc != nullptr);
  KvBlock<S> next = block_buffers<S>(sc, nkv, ndoc, doc != nullptr);
  fill_own(cur, qkv, doc, B, Tl, C);
  for (int s = 0; s < P; s++) {
    const int src = (r - s + P) % P;
    std::pair<CommHandle, CommHandle> flight;
    if (s + 1 < P) flight = pass_on(c, cur, next, nkv, ndoc);
    const std::vector<int32_t> k_pos = Zigzag{Tl * P, P, src}.positions();
    if (ops::attention_block_hidden(q_pos.data(), k_pos.data(), doc, cur.doc, B, Tl, Tl)) {
      st.skipped++;
    } else {
      ops::flash_block_bwd(dq, dkv, dkv + C, 2 * C, dout, qkv, 3 * C, cur.kv, cur.kv + C, 2 * C, lse, D, q_pos.data(),
                           k_pos.data(), doc, cur.doc, B, Tl, Tl, C, NH, ctx);
      st.computed++;
    }
    // The block's gradient goes on with it; after the last step it reaches the block's owner, and this
    // rank receives its own.
    c.send_recv(dkv, nkv, to, dkv_next, nkv, from, DType::f32, 2);
    std::swap(dkv, dkv_next);
    flight.first.wait();
    flight.second.wait();
    if (s + 1 < P) std::swap(cur, next);
  }
  // dqkv = [dq | dk | dv], rounded once.
  float* all = sc.take<float>(size_t(B) * Tl * 3 * C);
  for (int64_t n = 0; n < int64_t(B) * Tl; n++) {
    std::copy_n(dq + n * C, C, all + n * 3 * C);
    std::copy_n(dkv + n * 2 * C, 2 * C, all + n * 3 * C + C);
  }
  ops::convert(dqkv, static_cast<const float*>(all), int64_t(size_t(B) * Tl * 3 * C), ctx);
  return st;
}

#define MT_RING_INSTANTIATE(S)                                                                                  \
  template RingStats RingAttention::forward<S>(S*, float*, const S*, const int32_t*, int, int, int, int,         \
                                               const ops::Ctx&) const;                                           \
  template RingStats RingAttention::backward<S>(S*, const S*, const S*, const S*, const float*, const int32_t*,  \
                                                int, int, int, int, const ops::Ctx&) const;
MT_RING_INSTANTIATE(float)
MT_RING_INSTANTIATE(bf16)
MT_RING_INSTANTIATE(f16)
#undef MT_RING_INSTANTIATE

}  // namespace mt::parallel
