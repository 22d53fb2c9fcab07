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

// One rank's key/value block as it travels: (B,Tl,2C) [k | v] in the storage type, and the document
// ids of its rows (empty when unmasked).
template <class S>
struct KvBlock {
  std::vector<S> kv;
  std::vector<int32_t> doc;
};

template <class S>
KvBlock<S> own_block(const S* qkv, const int32_t* doc, int B, int Tl, int C) {
  KvBlock<S> blk;
  blk.kv.resize(size_t(B) * Tl * 2 * C);
  for (int64_t n = 0; n < int64_t(B) * Tl; n++) std::copy_n(qkv + n * 3 * C + C, 2 * C, blk.kv.data() + n * 2 * C);
  if (doc) blk.doc.assign(doc, doc + int64_t(B) * Tl);
  return blk;
}

// Starts the transfer of `cur` to the next rank and of the previous rank's block into `next`. The
// block in hand is only read while it is being sent.
template <class S>
std::pair<CommHandle, CommHandle> pass_on(Comm& c, const KvBlock<S>& cur, KvBlock<S>& next) {
  const int P = c.size(), to = (c.rank() + 1) % P, from = (c.rank() + P - 1) % P;
  next.kv.resize(cur.kv.size());
  next.doc.resize(cur.doc.size());
  CommHandle kv = c.send_recv_async(cur.kv.data(), cur.kv.size(), to, next.kv.data(), next.kv.size(), from,
                                    dtype_of<S>(), 0);
  CommHandle doc;
  if (!cur.doc.empty())
    doc = c.send_recv_async(cur.doc.data(), cur.doc.size(), to, next.doc.data(), next.doc.size(), from, DType::i32,
                            1);
  return {std::move(kv), std::move(doc)};
}

const int32_t* doc_of(const std::vector<int32_t>& d) { return d.empty() ? nullptr : d.data(); }

}  // namespace

template <class S>
RingStats RingAttention::forward(S* out, float* lse, const S* qkv, const int32_t* doc, int B, int Tl, int C, int NH,
                                 const ops::Ctx& ctx) const {
  Comm& c = comm();
  const int P = c.size(), r = c.rank();
  RingStats st;
  const std::vector<int32_t> q_pos = Zigzag{Tl * P, P, r}.positions();
  KvBlock<S> cur = own_block(qkv, doc, B, Tl, C), next;
  // fp32 accumulators: the merged output and lse, and one block's partial result.
  std::vector<float> O(size_t(B) * Tl * C, 0.f), L(size_t(B) * NH * Tl, -INFINITY), part_o(O.size()),
      part_l(L.size());
  for (int s = 0; s < P; s++) {
    const int src = (r - s + P) % P;
    std::pair<CommHandle, CommHandle> flight;
    if (s + 1 < P) flight = pass_on(c, cur, next);
    const std::vector<int32_t> k_pos = Zigzag{Tl * P, P, src}.positions();
    if (ops::attention_block_hidden(q_pos.data(), k_pos.data(), doc, doc_of(cur.doc), B, Tl, Tl)) {
      st.skipped++;
    } else {
      ops::flash_block_fwd(part_o.data(), part_l.data(), qkv, 3 * C, cur.kv.data(), cur.kv.data() + C, 2 * C,
                           q_pos.data(), k_pos.data(), doc, doc_of(cur.doc), B, Tl, Tl, C, NH, ctx);
      ops::attention_merge(O.data(), L.data(), part_o.data(), part_l.data(), B, Tl, C, NH, ctx);
      st.computed++;
    }
    flight.first.wait();
    flight.second.wait();
    if (s + 1 < P) std::swap(cur, next);
  }
  ops::convert(out, O.data(), int64_t(O.size()), ctx);
  std::copy(L.begin(), L.end(), lse);
  return st;
}

template <class S>
RingStats RingAttention::backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                                  const int32_t* doc, int B, int Tl, int C, int NH, const ops::Ctx& ctx) const {
  Comm& c = comm();
  const int P = c.size(), r = c.rank(), to = (r + 1) % P, from = (r + P - 1) % P;
  RingStats st;
  const std::vector<int32_t> q_pos = Zigzag{Tl * P, P, r}.positions();
  const size_t nkv = size_t(B) * Tl * 2 * C;
  std::vector<float> D(size_t(B) * NH * Tl), dq(size_t(B) * Tl * C, 0.f), dkv(nkv, 0.f), dkv_next(nkv);
  ops::attention_delta(D.data(), dout, out, B, Tl, C, NH, ctx);
  KvBlock<S> cur = own_block(qkv, doc, B, Tl, C), next;
  for (int s = 0; s < P; s++) {
    const int src = (r - s + P) % P;
    std::pair<CommHandle, CommHandle> flight;
    if (s + 1 < P) flight = pass_on(c, cur, next);
    const std::vector<int32_t> k_pos = Zigzag{Tl * P, P, src}.positions();
    if (ops::attention_block_hidden(q_pos.data(), k_pos.data(), doc, doc_of(cur.doc), B, Tl, Tl)) {
      st.skipped++;
    } else {
      ops::flash_block_bwd(dq.data(), dkv.data(), dkv.data() + C, 2 * C, dout, qkv, 3 * C, cur.kv.data(),
                           cur.kv.data() + C, 2 * C, lse, D.data(), q_pos.data(), k_pos.data(), doc,
                           doc_of(cur.doc), B, Tl, Tl, C, NH, ctx);
      st.computed++;
    }
    // The block's gradient goes on with it; after the last step it reaches the block's owner, and this
    // rank receives its own.
    c.send_recv(dkv.data(), nkv, to, dkv_next.data(), nkv, from, DType::f32, 2);
    std::swap(dkv, dkv_next);
    flight.first.wait();
    flight.second.wait();
    if (s + 1 < P) std::swap(cur, next);
  }
  // dqkv = [dq | dk | dv], rounded once.
  std::vector<float> all(size_t(B) * Tl * 3 * C);
  for (int64_t n = 0; n < int64_t(B) * Tl; n++) {
    std::copy_n(dq.data() + n * C, C, all.data() + n * 3 * C);
    std::copy_n(dkv.data() + n * 2 * C, 2 * C, all.data() + n * 3 * C + C);
  }
  ops::convert(dqkv, all.data(), int64_t(all.size()), ctx);
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
