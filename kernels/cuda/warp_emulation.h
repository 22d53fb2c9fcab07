// A host emulator for CUDA kernels, for checking them on machines without a GPU.
//
// A kernel header that builds with nvcc for the device also builds with the host compiler against this
// file (the *_kernels.cuh headers do): `launch` runs each thread of a block as a fiber (a user-space
// context with its own stack; see Context below) on the calling host thread, blocks one after another, with
//   - threadIdx, blockIdx, blockDim, gridDim per thread (1-, 2- and 3-D blocks, x fastest);
//   - __syncthreads and __syncthreads_or as barriers over the block's threads;
//   - __syncwarp, __shfl_xor_sync, __ballot_sync, mma.sync (m16n8k16, bf16/fp16 in, fp32
//     accumulate) and ldmatrix (m8n8.x4, plain and transposed) as exchanges among the 32 threads of a
//     warp, following the fragment layouts of the PTX ISA (kernels/cuda/mma.cuh);
//   - cp.async copies to shared memory, landing when a wait_group covers them or at once (Timing);
//   - static shared memory (MT_SHARED, common.cuh) and dynamic shared memory as one buffer per block.
//     Static shared memory starts as 0xff bytes (NaN floats, -1 ints), standing for the hardware's
//     undefined contents; dynamic shared memory starts zeroed.
// A thread runs until it reaches a barrier, then the next ready thread runs, in thread order (or, under
// Timing::early, its own warp's threads first), so a run is deterministic. Fibers rather than host threads: passing a barrier costs each thread one
// user-space context switch (tens of nanoseconds) instead of a wake-up through the operating system's
// scheduler, and a barrier that some threads never reach is reported (an exception from `launch`
// naming the block) instead of hanging. Every warp-level call must be reached by all 32 threads of the
// warp, as on the hardware. What it cannot show: timing, races the hardware would expose (here a missing barrier shows
// only where a thread reads shared data that a higher-numbered thread writes, since the lower one runs
// first), the tensor cores' own summation order, and the hardware's approximate exp2f/log2f. A kernel
// that passes here can still fail on a GPU, but one that fails here is wrong.
#pragma once
#if defined(__CUDACC__)
#error "warp_emulation.h is for host compilers; nvcc builds the real kernels"
#endif
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/dtype.h"

namespace mt::cuda::emu {

constexpr int kLanes = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Two orders of events, both ones the hardware may produce, that tests run a kernel under to expose
// two kinds of race (TimingScope):
//   late   the warps of a block advance together, one warp exchange at a time, and a cp.async copy
//          lands at the wait that covers it: a tile read before its wait holds the old contents;
//   early  each warp runs on to the next block barrier before the next warp starts, and a copy lands
//          when issued: a warp that refills a buffer without a barrier overwrites it before the
//          warps behind it have read it.
enum class Timing { late, early };
inline thread_local Timing timing = Timing::late;

// Sets the timing of the calling host thread's launches for the scope's lifetime.
class TimingScope {
 public:
  explicit TimingScope(Timing t) : saved_(timing) { timing = t; }
  ~TimingScope() { timing = saved_; }
  TimingScope(const TimingScope&) = delete;
  TimingScope& operator=(const TimingScope&) = delete;

 private:
  Timing saved_;
};

struct Fiber;

// A barrier over `count` threads of one block: the last to arrive releases the others and runs on.
class Barrier {
 public:
  // warp: the barrier of one warp's exchanges (under Timing::early the warp's threads then run on
  // before any other warp's).
  explicit Barrier(int count, bool warp = false) : count_(count), warp_(warp) {}
  Barrier(const Barrier&) = delete;
  Barrier& operator=(const Barrier&) = delete;
  void arrive_and_wait();

 private:
  int count_, arrived_ = 0;
  bool warp_;
  std::vector<Fiber*> waiting_;
};

// What the 32 threads of a warp exchange. Shuffles and ballots alternate between two word buffers, so
// one barrier per exchange suffices: no lane writes a buffer again before every lane has passed the
// next barrier, i.e. has read what the buffer held.
// A block whose size is not a multiple of 32 ends with a partial warp (`lanes` < 32), as on the
// hardware; warp-wide operations there are refused (require_full), since they name absent lanes.
struct Warp {
  explicit Warp(int lanes = kLanes) : sync(lanes, true), lanes(lanes) {}
  Barrier sync;
  int lanes;
  uint32_t a[kLanes][4], b[kLanes][2];
  uint64_t word[2][kLanes];
};

struct Block {
  Block(int threads, size_t smem_bytes)
      : sync(threads),
        // Undefined on a GPU: filled with 0xff bytes (NaN as any float type), so that a kernel reading
        // shared memory it never wrote cannot pass on zeros that happen to look like padding.
        smem((smem_bytes + 15) / 16, uint4{~0u, ~0u, ~0u, ~0u}),
        votes{std::vector<int>(size_t(threads)), std::vector<int>(size_t(threads))} {
    for (int t = 0; t < threads; t += kLanes) warps.emplace_back(std::min(kLanes, threads - t));
  }
  Barrier sync;
  std::deque<Warp> warps;                             // barriers do not move
  std::vector<uint4> smem;                            // dynamic shared memory
  std::map<const void*, std::vector<uint4>> statics;  // MT_SHARED arrays, by their declaration's tag
  std::vector<int> votes[2];                          // __syncthreads_or: a slot per thread, two buffers
};

// The registers a CUDA thread reads its coordinates from, and its place in the block.
struct ThreadState {
  uint3 thread_idx{}, block_idx{};
  dim3 block_dim, grid_dim;
  Block* block = nullptr;
  int tid = 0;                  // linear index in the block
  unsigned warp_exchanges = 0;  // shuffles and ballots so far: picks the word buffer
  unsigned block_votes = 0;     // __syncthreads_or calls so far: picks the vote buffer
  // cp.async: the copies not yet carried out, each with the index of the group it belongs to, and the
  // number of groups committed so far (copies issued since the last commit carry that number).
  struct AsyncCopy {
    void* dst;
    const void* src;
    bool valid;
    unsigned group;
  };
  std::vector<AsyncCopy> async_copies;
  unsigned async_groups = 0;
};

// A fiber's saved context and the switch between two. On x86-64 the switch is a few instructions of
// our own (mt_emu_switch below): it saves the registers a called function must preserve, the SSE and
// x87 control words and the stack pointer, and loads another fiber's. POSIX swapcontext would also save
// and restore the signal mask, a system call on every switch, which made it most of a simulated
// training step's time. Elsewhere, swapcontext.
#if defined(__x86_64__) && defined(__ELF__)
// mt_emu_switch(&from, to): pushes rbp, rbx, r12-r15 and the control words on the current stack,
// stores the stack pointer in *from, loads `to` and pops the same from there. Weak: each translation
// unit including this header emits it, and the linker keeps one.
extern "C" void mt_emu_switch(void** from, void* to);
__asm__(R"(
  .pushsection .text
  .weak mt_emu_switch
  .type mt_emu_switch, @function
mt_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size mt_emu_switch, .-mt_emu_switch
  .popsection
)");

struct Context {
  void* sp = nullptr;
};
inline void switch_context(Context& from, Context& to) { mt_emu_switch(&from.sp, to.sp); }
// Prepares c to enter entry() on the stack [stack, stack + bytes) at its first switch; entry never
// returns (it switches away for the last time).
inline void start_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15);
  auto* frame = reinterpret_cast<uint64_t*>(top - 72);  // control words, six registers, return address
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(fpucw));
  frame[0] = uint64_t(mxcsr) | uint64_t(fpucw) << 32;
  for (int r = 1; r <= 6; r++) frame[r] = 0;
  frame[7] = reinterpret_cast<uint64_t>(entry);  // `ret` lands here with rsp = top - 8, as after a call
  frame[8] = 0;
  c.sp = frame;
}
#else
struct Context {
  ucontext_t uc;
};
inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
inline void start_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

// One emulated thread: its context, its stack (with an inaccessible guard page below it, so an
// overflow faults instead of corrupting a neighbour) and its CUDA registers.
struct Fiber {
  static constexpr size_t kStackBytes = size_t(256) << 10;
  Fiber() {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    map_bytes = kStackBytes + page;
    void* p = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED || mprotect(p, page, PROT_NONE) != 0)
      throw std::runtime_error("warp emulator: cannot map a fiber stack");
    map = static_cast<char*>(p);
    stack = map + page;
  }
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
  ~Fiber() { munmap(map, map_bytes); }
  Context context;
  char* map = nullptr;
  char* stack = nullptr;
  size_t map_bytes = 0;
  ThreadState state;
};

// At least n fibers of the calling host thread, kept for later launches: mapping a stack per thread
// on every launch would cost more than most kernels do.
inline std::deque<Fiber>& fiber_pool(size_t n) {
  static thread_local std::deque<Fiber> pool;  // deque: fibers do not move
  while (pool.size() < n) pool.emplace_back();
  return pool;
}

// Runs the threads of one block at a time as fibers on the calling host thread.
class Scheduler {
 public:
  using Body = void (*)(void*);
  Scheduler(int threads, Body body, void* arg)
      : fibers_(fiber_pool(size_t(threads))), threads_(threads), body_(body), arg_(arg) {}

  // Runs the body on every thread of a block, starting from `base` (thread_idx and tid are set per
  // thread). False when the threads deadlocked: some wait at a barrier the others never reach.
  bool run_block(const ThreadState& base);
  void wait();  // the current thread blocks until a barrier wakes it
  void wake(Fiber* f) { ready_.push_back(f); }
  void wake_first(Fiber* f) { ready_.push_front(f); }
  Fiber* current() const { return current_; }
  int finished() const { return finished_; }
  std::exception_ptr error() const { return error_; }

 private:
  static void fiber_main();
  void switch_from(Fiber* from);

  std::deque<Fiber>& fibers_;
  int threads_;
  std::deque<Fiber*> ready_;
  Context main_;
  Fiber* current_ = nullptr;
  int finished_ = 0;
  Body body_;
  void* arg_;
  std::exception_ptr error_;
};

inline thread_local Scheduler* scheduler = nullptr;
inline thread_local ThreadState* running = nullptr;

// The registers of the thread running now.
inline ThreadState& self() { return *running; }

inline void Barrier::arrive_and_wait() {
  if (++arrived_ == count_) {
    arrived_ = 0;
    if (warp_ && timing == Timing::early) {
      for (auto f = waiting_.rbegin(); f != waiting_.rend(); ++f) scheduler->wake_first(*f);
    } else {
      for (Fiber* f : waiting_) scheduler->wake(f);
    }
    waiting_.clear();
    return;
  }
  waiting_.push_back(scheduler->current());
  scheduler->wait();
}

inline void Scheduler::switch_from(Fiber* from) {
  if (ready_.empty()) {  // every thread finished, or the rest wait: back to run_block
    switch_context(from->context, main_);
    return;
  }
  Fiber* to = ready_.front();
  ready_.pop_front();
  current_ = to;
  running = &to->state;
  switch_context(from->context, to->context);
}

inline void Scheduler::wait() { switch_from(current_); }

inline void Scheduler::fiber_main() {
  Scheduler& s = *scheduler;
  try {
    s.body_(s.arg_);
  } catch (...) {
    if (!s.error_) s.error_ = std::current_exception();
  }
  s.finished_++;
  s.switch_from(s.current_);
}

inline bool Scheduler::run_block(const ThreadState& base) {
  const dim3 bd = base.block_dim;
  for (int tid = 0; tid < threads_; tid++) {
    Fiber& f = fibers_[size_t(tid)];
    f.state = base;
    f.state.tid = tid;
    f.state.thread_idx = uint3{unsigned(tid) % bd.x, unsigned(tid) / bd.x % bd.y, unsigned(tid) / (bd.x * bd.y)};
    start_context(f.context, f.stack, Fiber::kStackBytes, &Scheduler::fiber_main);
    ready_.push_back(&f);
  }
  finished_ = 0;
  Fiber* first = ready_.front();
  ready_.pop_front();
  current_ = first;
  running = &first->state;
  switch_context(main_, first->context);
  running = nullptr;
  ready_.clear();
  return finished_ == threads_;
}

inline int lane() { return self().tid % kLanes; }
inline Warp& warp() { return self().block->warps[size_t(self().tid / kLanes)]; }

inline void require_full(unsigned mask, const char* what) {
  if (mask != kFullMask)
    throw std::logic_error(std::string("warp emulator: ") + what + " with a partial mask is not emulated");
  if (warp().lanes != kLanes)
    throw std::logic_error(std::string("warp emulator: ") + what + " in a partial warp of " +
                           std::to_string(warp().lanes) + " threads (undefined on the hardware: the mask names "
                           "absent lanes)");
}

template <class T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(self().block->smem.data());
}

// The block's one copy of a static shared array of type T, created on first use (see MT_SHARED).
template <class T>
T& static_shared(const void* tag) {
  std::vector<uint4>& buf = self().block->statics[tag];
  if (buf.empty()) {
    buf.resize((sizeof(T) + 15) / 16);
    std::memset(static_cast<void*>(buf.data()), 0xff, buf.size() * sizeof(uint4));
  }
  return *reinterpret_cast<T*>(buf.data());
}

template <class T>
T shfl_xor(T v, int mask) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- and 64-bit shuffles only");
  Warp& w = warp();
  const int l = lane();
  uint64_t* word = w.word[self().warp_exchanges++ % 2];
  std::memcpy(&word[l], &v, sizeof(T));
  w.sync.arrive_and_wait();
  T r;
  std::memcpy(&r, &word[l ^ mask], sizeof(T));
  return r;
}

inline unsigned ballot(int pred) {
  Warp& w = warp();
  uint64_t* word = w.word[self().warp_exchanges++ % 2];
  word[lane()] = pred != 0;
  w.sync.arrive_and_wait();
  unsigned bits = 0;
  for (int l = 0; l < kLanes; l++) bits |= unsigned(word[l]) << l;
  return bits;
}

inline int block_or(int pred) {
  Block& b = *self().block;
  std::vector<int>& votes = b.votes[self().block_votes++ % 2];
  votes[size_t(self().tid)] = pred != 0;
  b.sync.arrive_and_wait();
  return std::any_of(votes.begin(), votes.end(), [](int v) { return v != 0; });
}

inline float half_bits_to_float(uint32_t h, bool bf16) {
  if (bf16) {
    const uint32_t u = h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  return __half2float(__ushort_as_half(uint16_t(h)));
}

// Element (row, k) of the warp's A (16 x 16) and (k, col) of its B (16 x 8), from the lanes holding them.
inline float frag_a(const Warp& w, int row, int k, bool bf16) {
  const int owner = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
  return half_bits_to_float((w.a[owner][reg] >> (16 * (k & 1))) & 0xffffu, bf16);
}
inline float frag_b(const Warp& w, int k, int col, bool bf16) {
  const int owner = col * 4 + (k % 8) / 2, reg = k >= 8 ? 1 : 0;
  return half_bits_to_float((w.b[owner][reg] >> (16 * (k & 1))) & 0xffffu, bf16);
}

// c += a b (m16n8k16) for the calling lane's accumulator fragment.
inline void mma_m16n8k16(float c[4], const uint32_t a[4], const uint32_t b[2], bool bf16) {
  require_full(kFullMask, "mma.sync");
  Warp& w = warp();
  const int l = lane(), g = l / 4, t = l % 4;
  std::memcpy(w.a[l], a, sizeof(w.a[l]));
  std::memcpy(w.b[l], b, sizeof(w.b[l]));
  w.sync.arrive_and_wait();
  for (int e = 0; e < 4; e++) {
    const int row = g + 8 * (e / 2), col = 2 * t + (e % 2);
    float acc = c[e];
    for (int k = 0; k < 16; k++) acc += frag_a(w, row, k, bf16) * frag_b(w, k, col, bf16);  // products exact in fp32
    c[e] = acc;
  }
  w.sync.arrive_and_wait();
}

// Throws unless [p, p + bytes) lies in the calling block's shared memory (dynamic or MT_SHARED):
// ldmatrix and cp.async address shared memory only, undefined behaviour anywhere else.
inline void require_shared(const void* p, size_t bytes, const char* what) {
  const Block& b = *self().block;
  auto inside = [&](const std::vector<uint4>& v) {
    const auto* lo = reinterpret_cast<const char*>(v.data());
    const auto* q = static_cast<const char*>(p);
    return !v.empty() && q >= lo && q + bytes <= lo + v.size() * sizeof(uint4);
  };
  if (inside(b.smem)) return;
  for (const auto& [tag, v] : b.statics)
    if (inside(v)) return;
  throw std::logic_error(std::string("warp emulator: ") + what + " address outside the block's shared memory");
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane 8 m + i gives the address of row i (8
// consecutive 16-bit values, 16-byte aligned) of matrix m; lane 4 g + t receives in r[m] the elements
// (g, 2t) and (g, 2t + 1) of matrix m, or with trans (2t, g) and (2t + 1, g), the lower one in the low half.
inline void ldmatrix_x4(uint32_t r[4], const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0)
    throw std::logic_error("warp emulator: ldmatrix row address not 16-byte aligned");
  require_shared(row, 16, "ldmatrix row");
  require_full(kFullMask, "ldmatrix");
  Warp& w = warp();
  const int l = lane(), g = l / 4, t = l % 4;
  uint64_t* word = w.word[self().warp_exchanges++ % 2];
  word[l] = uint64_t(reinterpret_cast<uintptr_t>(row));
  w.sync.arrive_and_wait();
  for (int m = 0; m < 4; m++) {
    auto at = [&](int i, int j) {  // element (i, j) of matrix m
      uint16_t v;
      std::memcpy(&v, reinterpret_cast<const char*>(uintptr_t(word[8 * m + i])) + 2 * j, 2);
      return uint32_t(v);
    };
    r[m] = trans ? (at(2 * t, g) | at(2 * t + 1, g) << 16) : (at(g, 2 * t) | at(g, 2 * t + 1) << 16);
  }
}

// cp.async (16 bytes, kernels/cuda/async_copy.cuh). (The source is read when the copy lands: the
// kernels copy from inputs nobody writes.)

inline void cp_async_16(void* dst, const void* src, bool valid) {
  // The source must be aligned even for a zero-filling copy (src-size 0), which reads nothing.
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
    throw std::logic_error("warp emulator: cp.async address not 16-byte aligned");
  require_shared(dst, 16, "cp.async destination");
  if (timing == Timing::early) {
    if (valid) {
      std::memcpy(dst, src, 16);
    } else {
      std::memset(dst, 0, 16);
    }
    return;
  }
  ThreadState& s = self();
  s.async_copies.push_back({dst, src, valid, s.async_groups});
}
inline void cp_async_commit() { self().async_groups++; }
// cp.async.wait_group n: every group but the n most recently committed has landed.
inline void cp_async_wait(int n) {
  ThreadState& s = self();
  const unsigned landed = s.async_groups > unsigned(n) ? s.async_groups - unsigned(n) : 0u;
  std::vector<ThreadState::AsyncCopy> pending;
  for (const ThreadState::AsyncCopy& c : s.async_copies) {
    if (c.group >= landed) {
      pending.push_back(c);
    } else if (c.valid) {
      std::memcpy(c.dst, c.src, 16);
    } else {
      std::memset(c.dst, 0, 16);
    }
  }
  s.async_copies.swap(pending);
}

// Runs kernel(args...) over the grid, one fiber per CUDA thread, one block at a time. The block has
// block.x * block.y * block.z threads, at most 1024 (a last partial warp may not use warp-wide
// operations). Throws when a block deadlocks or the kernel throws (an emulator limit it reached).
template <class Kernel, class... Args>
void launch(dim3 grid, dim3 block, size_t smem_bytes, Kernel kernel, Args... args) {
  const int threads = int(block.x * block.y * block.z);
  if (threads <= 0 || threads > 1024)
    throw std::invalid_argument("warp emulator: " + std::to_string(threads) + " threads per block (need 1 to 1024)");
  auto body = [&] { kernel(args...); };
  Scheduler sched(threads, [](void* p) { (*static_cast<decltype(body)*>(p))(); }, &body);
  struct Current {
    explicit Current(Scheduler* s) { scheduler = s; }
    ~Current() { scheduler = nullptr; }
  } current(&sched);
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        Block blk(threads, smem_bytes);
        ThreadState base;
        base.block_idx = uint3{x, y, z};
        base.block_dim = block;
        base.grid_dim = grid;
        base.block = &blk;
        const bool completed = sched.run_block(base);
        if (sched.error()) std::rethrow_exception(sched.error());
        if (!completed)
          throw std::runtime_error("warp emulator: block (" + std::to_string(x) + ", " + std::to_string(y) + ", " +
                                   std::to_string(z) + ") deadlocked: " + std::to_string(threads - sched.finished()) +
                                   " of " + std::to_string(threads) +
                                   " threads wait at a barrier or warp exchange the others never reach");
      }
}

}  // namespace mt::cuda::emu

// The CUDA names the kernels use, for the host build.
#define threadIdx (::mt::cuda::emu::self().thread_idx)
#define blockIdx (::mt::cuda::emu::self().block_idx)
#define blockDim (::mt::cuda::emu::self().block_dim)
#define gridDim (::mt::cuda::emu::self().grid_dim)
#define __launch_bounds__(...)
inline void __syncthreads() { ::mt::cuda::emu::self().block->sync.arrive_and_wait(); }
inline int __syncthreads_or(int pred) { return ::mt::cuda::emu::block_or(pred); }
inline void __syncwarp(unsigned mask = ::mt::cuda::emu::kFullMask) {
  ::mt::cuda::emu::require_full(mask, "__syncwarp");
  ::mt::cuda::emu::warp().sync.arrive_and_wait();
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  ::mt::cuda::emu::require_full(mask, "__shfl_xor_sync");
  return ::mt::cuda::emu::shfl_xor(v, lane_mask);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  ::mt::cuda::emu::require_full(mask, "__ballot_sync");
  return ::mt::cuda::emu::ballot(pred);
}
inline int __popc(unsigned x) { return std::popcount(x); }
inline uint32_t __float_as_uint(float f) { return ::mt::f32_bits(f); }
inline float __uint_as_float(uint32_t u) { return ::mt::f32_from_bits(u); }
using std::max;
using std::min;
