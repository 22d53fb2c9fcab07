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
// arena of their own on the host. Host arrays (document ids) come from the arena when it is host memory.
class Scratch {
 public:
  explicit Scratch(Arena* arena) : ar_(arena ? *arena : host_) {}
  Arena& arena() { return ar_; }
  template <class T>
  T* take(size_t n) {
    return static_cast<T*>(keep(ar_.alloc_uninitialized(MemCategory::activations, n * sizeof(T))));
  }
  template <class T>
  T* take_host(size_t n) {
    Arena& a = ar_.device() == Device::cpu ? ar_ : host_;
    return static_cast<T*>(keep(a.alloc_uninitialized(MemCategory::activations, n * sizeof(T))));
  }
  template <class T>
  T* take_zeroed(size_t n) {
    T* p = take<T>(n);
    ar_.mem().zero(p, n * sizeof(T));
    return p;
  }

 private:
  void* keep(Buffer b) {
    bufs_.push_back(std::move(b));
    return bufs_.back().data();
  }
  Arena host_;
  Arena& ar_;
  std::vector<Buffer> bufs_;  // declared last: returned before host_ goes
};

// One rank's key/value block as it travels: (B,Tl,2C) [k | v] in ctx's memory, and the document ids
// of its rows on the host (for the skip) and in ctx's memory (for the kernels; the same array on the
// CPU), nullptr when unmasked.
template <class S>
struct KvBlock {
  S* kv = nullptr;
  int32_t* doc = nullptr;
  int32_t* doc_dev = nullptr;
};

// The ring of one forward or backward call: the block in hand and the next, every cp rank's positions
// (host and ctx's memory), and the transfers in flight. The blocks travel over `blocks` (the cp
// group's NCCL communicator on a GPU: device buffers, on its stream, ordered after the compute stream
// and before it by events, never a host wait), their document ids over the host communicator `ids`
// (the host keeps them: it decides the skips without downloading anything). Each step is one grouped
// send to rank + 1 and receive from rank - 1 on every rank, in the same order everywhere: under
// rendezvous sends (NCCL's) the k-th exchange of rank r meets the k-th of r - 1 and r + 1, so the
// ring cannot deadlock (the argument of parallel/pipeline_exchange.h, with one exchange per step).
template <class S>
class Ring {
 public:
  Ring(Comm& ids, Comm& blocks, Arena* arena, const int32_t* doc, const int32_t* doc_host, int B, int Tl, int C,
       const ops::Ctx& ctx)
      : ids_(ids), blocks_(blocks), sc_(arena), ctx_(ctx), doc_(doc), doc_host_(doc_host), P_(ids.size()),
        r_(ids.rank()), Tl_(Tl),
        nkv_(size_t(B) * Tl * 2 * C), ndoc_(size_t(B) * Tl) {
    MT_CHECK(ctx.device == Device::cpu || (arena && arena->device() == ctx.device),
             "ring attention on the device needs the run's device arena for its buffers");
    MT_CHECK((doc == nullptr) == (doc_host == nullptr),
             "ring attention: document ids where the kernels read them and on the host, both or neither");
    MT_CHECK(blocks.size() == P_ && blocks.rank() == r_, "ring attention: the block communicator is not the cp group");
    pos_.resize(size_t(P_) * Tl);
    for (int p = 0; p < P_; p++) {
      const std::vector<int32_t> z = Zigzag{Tl * P_, P_, p}.positions();
      std::copy(z.begin(), z.end(), pos_.begin() + int64_t(p) * Tl);
    }
    pos_dev_ = pos_.data();
    if (ctx.device != Device::cpu) {
      int32_t* d = sc_.take<int32_t>(pos_.size());
      sc_.arena().upload(d, pos_.data(), pos_.size() * 4);
      pos_dev_ = d;
    }
    for (KvBlock<S>* b : {&cur_, &next_}) {
      b->kv = sc_.take<S>(nkv_);
      if (!doc) continue;
      b->doc = sc_.take_host<int32_t>(ndoc_);
      b->doc_dev = ctx.device == Device::cpu ? b->doc : sc_.take<int32_t>(ndoc_);
    }
    if (doc) std::copy_n(doc_host, ndoc_, cur_.doc);
  }

  Scratch& scratch() { return sc_; }
  // This rank's own block, copied out of its qkv (B,Tl,3C).
  void fill_own(const S* qkv, int C) {
    ops::copy_columns(cur_.kv, 2 * C, qkv + C, 3 * C, int64_t(ndoc_), 2 * C, ctx_);
  }
  // The rank whose block is in hand at step s, and whether the queries see none of it.
  int source(int s) const { return (r_ - s + P_) % P_; }
  bool hidden(int s, int B) const {
    return ops::attention_block_hidden(pos(r_), pos(source(s)), doc_host_, cur_.doc, B, Tl_, Tl_);
  }
  const S* kv() const { return cur_.kv; }
  const int32_t* q_pos() const { return pos_dev_ + int64_t(r_) * Tl_; }
  const int32_t* k_pos(int s) const { return pos_dev_ + int64_t(source(s)) * Tl_; }
  // The block's document ids where the kernels read them (the caller's array at step 0).
  const int32_t* k_doc(int s) const { return s == 0 ? doc_ : cur_.doc_dev; }

  // Starts the transfer of the block in hand to the next rank and of the previous rank's into the
  // other buffers (not at the last step). The block in hand is only read while it is being sent.
  void pass_on(int s) {
    if (s + 1 >= P_) return;
    const int to = (r_ + 1) % P_, from = (r_ + P_ - 1) % P_;
    kv_flight_ = blocks_.send_recv_async(cur_.kv, nkv_, to, next_.kv, nkv_, from, dtype_of<S>(), 0);
    if (cur_.doc) doc_flight_ = ids_.send_recv_async(cur_.doc, ndoc_, to, next_.doc, ndoc_, from, DType::i32, 1);
  }
  // Ends step s: the transfers complete (on a device the compute stream waits for the blocks; the
  // host waits for the ids and uploads them, in stream order), and the received block is in hand.
  void finish(int s) {
    kv_flight_.wait();
    doc_flight_.wait();
    if (s + 1 >= P_) return;
    if (next_.doc && ctx_.device != Device::cpu) sc_.arena().upload(next_.doc_dev, next_.doc, ndoc_ * 4);
    std::swap(cur_, next_);
  }

 private:
  const int32_t* pos(int rank) const { return pos_.data() + int64_t(rank) * Tl_; }

  Comm &ids_, &blocks_;
  Scratch sc_;
  const ops::Ctx& ctx_;
  const int32_t *doc_, *doc_host_;  // this rank's rows' ids: in ctx's memory, on the host
  int P_, r_, Tl_;
  size_t nkv_, ndoc_;
  std::vector<int32_t> pos_;  // (P,Tl) every rank's positions, rank by rank
  const int32_t* pos_dev_ = nullptr;
  KvBlock<S> cur_, next_;
  CommHandle kv_flight_, doc_flight_;
};

}  // namespace

template <class S>
RingStats RingAttention::forward(S* out, float* lse, const S* qkv, const int32_t* doc, const int32_t* doc_host, int B,
                                 int Tl, int C, int NH, const ops::Ctx& ctx) const {
  Ring<S> ring(comm(), *blocks_, arena_, doc, doc_host, B, Tl, C, ctx);
  RingStats st;
  const size_t no = size_t(B) * Tl * C, nl = size_t(B) * NH * Tl;
  Scratch& sc = ring.scratch();
  // fp32 accumulators: the merged output and lse, and one block's partial result. The first block
  // computed (the own one: its diagonal is always visible) is written into them directly.
  float *O = sc.take<float>(no), *L = sc.take<float>(nl), *part_o = sc.take<float>(no), *part_l = sc.take<float>(nl);
  ring.fill_own(qkv, C);
  for (int s = 0; s < size(); s++) {
    ring.pass_on(s);
    if (ring.hidden(s, B)) {
      st.skipped++;
    } else {
      const bool first = st.computed == 0;
      ops::flash_block_fwd(first ? O : part_o, first ? L : part_l, qkv, 3 * C, ring.kv(), ring.kv() + C, 2 * C,
                           ring.q_pos(), ring.k_pos(s), doc, ring.k_doc(s), B, Tl, Tl, C, NH, ctx);
      if (!first) ops::attention_merge(O, L, part_o, part_l, B, Tl, C, NH, ctx);
      st.computed++;
    }
    ring.finish(s);
  }
  MT_CHECK(st.computed > 0, "ring attention: every block hidden, the own one too");
  ops::convert(out, static_cast<const float*>(O), int64_t(no), ctx);
  sc.arena().mem().move(lse, L, nl * sizeof(float));
  return st;
}

template <class S>
RingStats RingAttention::backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                                  const int32_t* doc, const int32_t* doc_host, int B, int Tl, int C, int NH,
                                  const ops::Ctx& ctx) const {
  Ring<S> ring(comm(), *blocks_, arena_, doc, doc_host, B, Tl, C, ctx);
  Comm& c = *blocks_;
  const int P = size(), to = (rank() + 1) % P, from = (rank() + P - 1) % P;
  RingStats st;
  const size_t nkv = size_t(B) * Tl * 2 * C, nq = size_t(B) * Tl * C;
  Scratch& sc = ring.scratch();
  float *D = sc.take<float>(size_t(B) * NH * Tl), *dq = sc.take_zeroed<float>(nq), *dkv = sc.take_zeroed<float>(nkv),
        *dkv_next = sc.take<float>(nkv);
  ops::attention_delta(D, dout, out, B, Tl, C, NH, ctx);
  ring.fill_own(qkv, C);
  for (int s = 0; s < P; s++) {
    ring.pass_on(s);
    if (ring.hidden(s, B)) {
      st.skipped++;
    } else {
      ops::flash_block_bwd(dq, dkv, dkv + C, 2 * C, dout, qkv, 3 * C, ring.kv(), ring.kv() + C, 2 * C, lse, D,
                           ring.q_pos(), ring.k_pos(s), doc, ring.k_doc(s), B, Tl, Tl, C, NH, ctx);
      st.computed++;
    }
    // The block's gradient goes on with it; after the last step it reaches the block's owner, and this
    // rank receives its own.
    c.send_recv(dkv, nkv, to, dkv_next, nkv, from, DType::f32, 2);
    std::swap(dkv, dkv_next);
    ring.finish(s);
  }
  // dqkv = [dq | dk | dv], rounded once.
  const int64_t N = int64_t(B) * Tl;
  float* all = sc.take<float>(size_t(N) * 3 * C);
  ops::copy_columns(all, 3 * C, static_cast<const float*>(dq), C, N, C, ctx);
  ops::copy_columns(all + C, 3 * C, static_cast<const float*>(dkv), 2 * C, N, 2 * C, ctx);
  ops::convert(dqkv, static_cast<const float*>(all), N * 3 * C, ctx);
  return st;
}

#define MT_RING_INSTANTIATE(S)                                                                                  \
  template RingStats RingAttention::forward<S>(S*, float*, const S*, const int32_t*, const int32_t*, int, int, int, \
                                               int, const ops::Ctx&) const;                                       \
  template RingStats RingAttention::backward<S>(S*, const S*, const S*, const S*, const float*, const int32_t*,   \
                                                const int32_t*, int, int, int, int, const ops::Ctx&) const;
MT_RING_INSTANTIATE(float)
MT_RING_INSTANTIATE(bf16)
MT_RING_INSTANTIATE(f16)
#undef MT_RING_INSTANTIATE

}  // namespace mt::parallel
