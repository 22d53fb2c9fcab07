#include "runtime/arena.h"

#include <algorithm>
#include <cstring>

#include "runtime/check.h"

namespace mt {

const char* mem_category_name(MemCategory c) {
  static const char* names[] = {"params", "grads", "optimizer", "activations", "comm", "other"};
  return names[int(c)];
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    arena_ = o.arena_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    block_ = o.block_;
    cat_ = o.cat_;
    o.arena_ = nullptr;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
    o.block_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (arena_ && ptr_) arena_->release(ptr_, bytes_, block_, cat_);
  arena_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
  block_ = 0;
}

Arena::Arena() : Arena(host_memory()) {}

Arena::Arena(const MemOps& mem) : alloc_(mem.alloc), free_(mem.free), mem_(mem) {}

Arena::Arena(AllocFn alloc, FreeFn free)
    : alloc_(std::move(alloc)), free_(std::move(free)), mem_(host_memory()), custom_alloc_(true) {}

Arena::~Arena() { free_cache(); }

Buffer Arena::alloc(MemCategory cat, size_t bytes) {
  if (bytes == 0) return Buffer();
  const RegionScope region(regions_, "allocation");
  size_t block = bytes;
  if (void* p = reuse(bytes, true, &block)) return take(cat, bytes, block, p);
  return take(cat, bytes, bytes, alloc_(bytes));
}

Buffer Arena::alloc_uninitialized(MemCategory cat, size_t bytes) {
  if (bytes == 0) return Buffer();
  const RegionScope region(regions_, "allocation");
  size_t block = bytes;
  if (void* p = reuse(bytes, false, &block)) return take(cat, bytes, block, p);
  // A custom allocator (the third constructor) has no uninitialised variant: it zero-fills.
  return take(cat, bytes, bytes, mem_.alloc_uninit && !custom_alloc_ ? mem_.alloc_uninit(bytes) : alloc_(bytes));
}

void* Arena::reuse(size_t bytes, bool zero, size_t* block) {
  auto it = kept_.lower_bound(bytes);  // the smallest kept block of at least `bytes`
  if (it == kept_.end() || it->first / 2 > bytes) return nullptr;
  void* p = it->second;
  *block = it->first;
  kept_bytes_ -= it->first;
  kept_.erase(it);
  // The same contents a fresh block has: zeros, or the poison of MemOps::alloc_uninit (NaN bytes);
  // without poison, an uninitialised block keeps its last owner's bytes.
  if (zero || !mem_.alloc_uninit)
    host_fill(p, 0, bytes);
  else if (poison_reused_)
    host_fill(p, 0xFF, bytes);
  return p;
}

void Arena::trim_cache() {
  while (!kept_.empty() && held_live_ + kept_bytes_ > most_live_ + most_live_ / kKeptHeadroom) {
    auto largest = std::prev(kept_.end());
    kept_bytes_ -= largest->first;
    free_(largest->second);
    kept_.erase(largest);
  }
}

void Arena::free_cache() {
  for (const auto& [bytes, p] : kept_) free_(p);
  kept_.clear();
  kept_bytes_ = 0;
}

Buffer Arena::take(MemCategory cat, size_t bytes, size_t block, void* p) {
  Buffer b;
  MT_CHECK(p != nullptr, "out of memory allocating %s for %s", format_bytes(bytes).c_str(), mem_category_name(cat));
  b.arena_ = this;
  b.ptr_ = p;
  b.bytes_ = bytes;
  b.block_ = block;
  b.cat_ = cat;
  size_t i = size_t(cat);
  stats_.live[i] += bytes;
  stats_.live_total += bytes;
  stats_.peak[i] = std::max(stats_.peak[i], stats_.live[i]);
  stats_.peak_total = std::max(stats_.peak_total, stats_.live_total);
  held_live_ += block;
  most_live_ = std::max(most_live_, held_live_);
  trim_cache();
  return b;
}

void Arena::release(void* p, size_t bytes, size_t block, MemCategory cat) {
  const RegionScope region(regions_, "allocation");
  held_live_ -= block;
  if (caches_blocks()) {
    kept_.emplace(block, p);
    kept_bytes_ += block;
  } else {
    free_(p);
  }
  stats_.live[size_t(cat)] -= bytes;
  stats_.live_total -= bytes;
}

void Arena::upload(void* dst, const void* src, size_t bytes) {
  if (!mem_.make_upload_staging) return mem_.upload(dst, src, bytes);
  if (!staging_) staging_ = mem_.make_upload_staging(mem_.wait);
  staging_->upload(dst, src, bytes);
}

void Arena::set_device_wait(const DeviceWait* wait) {
  MT_CHECK(!staging_, "Arena::set_device_wait after the first upload: the upload staging would keep the old wait");
  mem_.wait = wait;
}

void Arena::reset_peaks() {
  stats_.peak = stats_.live;
  stats_.peak_total = stats_.live_total;
}

std::string format_bytes(size_t bytes) {
  double b = double(bytes);
  if (b < 1024) return strfmt("%zu B", bytes);
  if (b < 1024.0 * 1024) return strfmt("%.1f KiB", b / 1024);
  if (b < 1024.0 * 1024 * 1024) return strfmt("%.1f MiB", b / (1024.0 * 1024));
  return strfmt("%.2f GiB", b / (1024.0 * 1024 * 1024));
}

}  // namespace mt
