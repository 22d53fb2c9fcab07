// Arena: every byte the trainer allocates goes through here, tagged with a category, so memory is
// measured (live and peak per category, and peak of the total) rather than estimated.
//
// On the CPU backend blocks come from aligned host memory; a device backend passes its MemOps
// (runtime/memory.h), which the arena also hands to the owners of its blocks so they can zero and
// copy them without knowing where they live. Blocks are RAII (Buffer) so activations freed during backward show up in the
// live counters immediately and the peak reflects what activation checkpointing really saves.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "runtime/memory.h"
#include "runtime/regions.h"

namespace mt {

enum class MemCategory : uint8_t { params, grads, optimizer, activations, comm, other };
constexpr int kNumMemCategories = 6;
const char* mem_category_name(MemCategory c);

struct MemStats {
  std::array<size_t, kNumMemCategories> live{};
  std::array<size_t, kNumMemCategories> peak{};
  size_t live_total = 0;
  size_t peak_total = 0;
};

class Arena;

// An owned block of memory; returns itself to its arena when destroyed.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset();
  void* data() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  int32_t* i32() const { return static_cast<int32_t*>(ptr_); }
  size_t bytes() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  friend class Arena;
  Arena* arena_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  size_t block_ = 0;  // the block's own size: bytes_, or more where a larger kept block was reused
  MemCategory cat_ = MemCategory::other;
};

class Arena {
 public:
  using AllocFn = std::function<void*(size_t)>;
  using FreeFn = std::function<void(void*)>;

  Arena();  // host memory, 64-byte aligned, zero-filled
  explicit Arena(const MemOps& mem);  // blocks from mem.alloc (zero-filled), on mem.device
  // Custom allocation of host-accessible memory (copies and zeroing stay host operations).
  Arena(AllocFn alloc, FreeFn free);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  // Allocates `bytes` (zero-filled) tagged with `cat`.
  Buffer alloc(MemCategory cat, size_t bytes);
  // The same with unspecified contents (MemOps::alloc_uninit: no zero fill on a device, poisoned with
  // NaN on the host), for buffers that are always written before they are read.
  Buffer alloc_uninitialized(MemCategory cat, size_t bytes);
  // How to zero, copy and round this arena's blocks; mem().device says where they live.
  const MemOps& mem() const { return mem_; }
  // How mem().sync(), downloads and the upload staging wait for the device (MemOps::wait; nullptr:
  // they block). Before the first upload.
  void set_device_wait(const DeviceWait* wait);
  // Copies host bytes into one of this arena's blocks in the order of the device's work, without
  // waiting for it: the source may be reused at once (MemOps::make_upload_staging; on the host, a copy).
  void upload(void* dst, const void* src, size_t bytes);
  Device device() const { return mem_.device; }
  const MemStats& stats() const { return stats_; }
  // Sets every peak to the current live value, so the next phase measures its own peak.
  void reset_peaks();
  // Profiling and traced runs: every allocation and release is an "allocation" region of `sink`
  // (runtime/regions.h); nullptr: none.
  void set_region_sink(RegionSink* sink) { regions_ = sink; }
  // Bytes of freed host blocks kept for reuse (below): held, not live, and not in stats().
  size_t kept_bytes() const { return kept_bytes_; }
  // Whether alloc_uninitialized poisons a reused host block as it does a new one (on, the default), or
  // hands it out holding what its last owner wrote. Poisoning every reused block costs a pass over a
  // step's activations (about 3% of a GPT-2 step on the CPU), so a run turns it off unless it is
  // hunting a kernel that reads before it writes (the trainer's mem.poison); new blocks are poisoned
  // either way.
  void set_poison_reused(bool on) { poison_reused_ = on; }
  bool poison_reused() const { return poison_reused_; }

 private:
  friend class Buffer;
  // Accounts a block of `block` bytes handed out for `bytes` (p: nullptr = out of memory).
  Buffer take(MemCategory cat, size_t bytes, size_t block, void* p);
  void release(void* p, size_t bytes, size_t block, MemCategory cat);
  // Host blocks. A step asks for much the same sizes every time, so a block its owner frees is kept
  // for a later request instead of going back to the C library, which hands large blocks back to the
  // system and takes them again as fresh pages, each faulted in and cleared by the kernel before the
  // fill even starts. A request takes the smallest kept block of at least its size and at most twice
  // it: the exact size where one is kept (every dense buffer, every step), else a larger one, so that
  // buffers whose sizes follow the routing (a mixture layer's rows, expert parallelism's received
  // tokens) find last step's blocks (with exact sizes only, dp2 x ep2 gpt2-moe made about 110 fresh
  // allocations over 1 MiB a step on its two ranks; 25 after three steps with this rule). Never more
  // is held than an eighth over the most the arena has held live: a request the cache cannot serve
  // first frees kept blocks, largest first, until the live blocks and the kept ones together are
  // within that figure again. The eighth lets a step's one-off size sit beside the blocks the rest of
  // the step needs: with no headroom GPT-2's classifier chunk (51 MB) pushed out three other blocks
  // every step, and they it, 4 fresh blocks (76 MB) a step for gpt2 and 7 (111 MB) for gpt2-moe,
  // 0.6% and 2.5% of the step (docs/perf.md); the process's resident peak grew by 28 MB of 6.3 GB.
  // stats() counts the bytes asked for; held_live_ and the bound count the blocks' own sizes.
  bool caches_blocks() const { return mem_.device == Device::cpu && !custom_alloc_; }
  // A kept block for `bytes` (its size in *block), zeroed or poisoned over `bytes`; nullptr if none.
  void* reuse(size_t bytes, bool zero, size_t* block);
  bool poison_reused_ = true;
  void trim_cache();
  void free_cache();
  std::multimap<size_t, void*> kept_;
  size_t kept_bytes_ = 0;
  size_t held_live_ = 0;  // the live blocks' own sizes
  size_t most_live_ = 0;  // the most ever held live at once (reset_peaks leaves it)
  static constexpr size_t kKeptHeadroom = 8;  // kept blocks may take the held total 1/8 over most_live_
  RegionSink* regions_ = nullptr;
  AllocFn alloc_;
  FreeFn free_;
  MemOps mem_;
  std::unique_ptr<UploadStaging> staging_;  // made on the first upload
  bool custom_alloc_ = false;
  MemStats stats_;
};

std::string format_bytes(size_t bytes);  // "12.3 MiB"

}  // namespace mt
