// Memory accounting (Arena, Buffer) and the flat parameter store (ParamStore).
//
// Arena promises: live bytes per category follow Buffer lifetimes exactly (RAII, moves transfer
// ownership), peaks are the maxima of live bytes since the last reset_peaks(), host blocks are
// 64-byte aligned and zero-filled (poisoned when uninitialised), a freed host block serves the next
// request of its size refilled as a fresh one, the blocks kept for that never make the arena hold more
// than the most it has had live, a failed allocation throws naming the category.
// ParamStore promises: every entry starts at a multiple of 16 elements (64 bytes) inside its unit,
// entries do not overlap, units tile the flat range and are padded to whole 64-byte shard chunks,
// counts exclude the padding, the buffers are charged to params/grads, and refresh_compute() makes
// compute the master weights rounded to the compute dtype.
#include <gtest/gtest.h>

#include <algorithm>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/arena.h"
#include "runtime/check.h"
#include "runtime/dtype.h"
#include "runtime/param_store.h"
#include "tests/test_util.h"

namespace mt {
namespace {

size_t live(const Arena& a, MemCategory c) { return a.stats().live[size_t(c)]; }
size_t peak(const Arena& a, MemCategory c) { return a.stats().peak[size_t(c)]; }

TEST(Arena, LiveAndPeakBytesFollowBufferLifetimesPerCategory) {
  Arena a;
  {
    Buffer p = a.alloc(MemCategory::params, 1000);
    Buffer g = a.alloc(MemCategory::grads, 500);
    EXPECT_EQ(live(a, MemCategory::params), 1000u);
    EXPECT_EQ(live(a, MemCategory::grads), 500u);
    {
      Buffer x1 = a.alloc(MemCategory::activations, 4000);
      Buffer x2 = a.alloc(MemCategory::activations, 3000);
      EXPECT_EQ(live(a, MemCategory::activations), 7000u);
      EXPECT_EQ(a.stats().live_total, 8500u);
    }
    EXPECT_EQ(live(a, MemCategory::activations), 0u);
    EXPECT_EQ(peak(a, MemCategory::activations), 7000u);
    EXPECT_EQ(a.stats().peak_total, 8500u);
    EXPECT_EQ(a.stats().live_total, 1500u);

    a.reset_peaks();  // the next phase measures its own peak
    EXPECT_EQ(peak(a, MemCategory::activations), 0u);
    EXPECT_EQ(peak(a, MemCategory::params), 1000u);
    EXPECT_EQ(a.stats().peak_total, 1500u);
    Buffer x3 = a.alloc(MemCategory::activations, 2000);
    EXPECT_EQ(peak(a, MemCategory::activations), 2000u);
    EXPECT_EQ(a.stats().peak_total, 3500u);
    x3.reset();
    x3.reset();  // idempotent
    EXPECT_FALSE(x3);
    EXPECT_EQ(live(a, MemCategory::activations), 0u);
    EXPECT_EQ(peak(a, MemCategory::other), 0u);
  }
  EXPECT_EQ(a.stats().live_total, 0u);
  for (int c = 0; c < kNumMemCategories; c++)
    EXPECT_EQ(a.stats().live[size_t(c)], 0u) << mem_category_name(MemCategory(c));
}

TEST(Arena, HostBlocksAreAlignedAndZeroed) {
  Arena a;
  std::mt19937_64 rng(mt::testing::test_seed());
  std::vector<Buffer> bufs;
  for (int i = 0; i < 20; i++) {
    const size_t n = 1 + rng() % 5000;
    Buffer b = a.alloc(MemCategory::other, n);
    ASSERT_TRUE(b);
    EXPECT_EQ(b.bytes(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
    const auto* bytes = static_cast<const unsigned char*>(b.data());
    for (size_t k = 0; k < n; k++) ASSERT_EQ(bytes[k], 0) << "byte " << k << " of a " << n << "-byte block";
    EXPECT_EQ(static_cast<void*>(b.f32()), b.data());
    EXPECT_EQ(static_cast<void*>(b.i32()), b.data());
    bufs.push_back(std::move(b));
  }
  Buffer empty = a.alloc(MemCategory::comm, 0);
  EXPECT_FALSE(empty);
  EXPECT_EQ(live(a, MemCategory::comm), 0u);
}

TEST(Arena, MovingABufferTransfersOwnershipAndAssignmentReleasesTheOldBlock) {
  Arena a;
  Buffer b = a.alloc(MemCategory::comm, 256);
  void* p = b.data();
  Buffer c = std::move(b);
  EXPECT_FALSE(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(live(a, MemCategory::comm), 256u);
  c = a.alloc(MemCategory::comm, 64);  // the 256-byte block goes back
  EXPECT_EQ(live(a, MemCategory::comm), 64u);
  c = Buffer();
  EXPECT_EQ(live(a, MemCategory::comm), 0u);
  EXPECT_EQ(peak(a, MemCategory::comm), 320u);  // both existed for a moment
}

TEST(Arena, AFreedHostBlockServesTheNextRequestOfItsSizeFilledAsAFreshOne) {
  Arena a;
  Buffer b = a.alloc(MemCategory::activations, 4096);
  void* p = b.data();
  std::memset(p, 0x12, 4096);
  b.reset();
  EXPECT_EQ(a.kept_bytes(), 4096u);
  EXPECT_EQ(a.stats().live_total, 0u);
  Buffer c = a.alloc_uninitialized(MemCategory::activations, 4096);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(a.kept_bytes(), 0u);
  const auto* bytes = static_cast<const unsigned char*>(c.data());
  for (size_t k = 0; k < 4096; k++) ASSERT_EQ(bytes[k], 0xFF) << "byte " << k << ": not poisoned";
  std::memset(c.data(), 0x34, 4096);
  c.reset();
  Buffer d = a.alloc(MemCategory::grads, 4096);
  EXPECT_EQ(d.data(), p);
  bytes = static_cast<const unsigned char*>(d.data());
  for (size_t k = 0; k < 4096; k++) ASSERT_EQ(bytes[k], 0) << "byte " << k << ": not zeroed";
  EXPECT_EQ(live(a, MemCategory::grads), 4096u);
}

TEST(Arena, WithoutPoisonAReusedUninitialisedBlockKeepsItsBytesAndAZeroedOneIsStillZeroed) {
  Arena a;
  a.set_poison_reused(false);
  Buffer b = a.alloc_uninitialized(MemCategory::activations, 4096);
  void* p = b.data();
  const auto* bytes = static_cast<const unsigned char*>(p);
  for (size_t k = 0; k < 4096; k++) ASSERT_EQ(bytes[k], 0xFF) << "byte " << k << ": a new block is poisoned";
  std::memset(p, 0x12, 4096);
  b.reset();
  Buffer c = a.alloc_uninitialized(MemCategory::activations, 4096);
  ASSERT_EQ(c.data(), p);
  for (size_t k = 0; k < 4096; k++) ASSERT_EQ(bytes[k], 0x12) << "byte " << k << ": the last owner's bytes";
  c.reset();
  Buffer d = a.alloc(MemCategory::grads, 4096);
  ASSERT_EQ(d.data(), p);
  for (size_t k = 0; k < 4096; k++) ASSERT_EQ(bytes[k], 0) << "byte " << k << ": not zeroed";
}

TEST(Arena, ARequestTakesTheSmallestKeptBlockUpToTwiceItsSize) {
  Arena a;
  void *small, *large;
  {
    Buffer x = a.alloc(MemCategory::activations, 4096), y = a.alloc(MemCategory::activations, 10000),
           z = a.alloc(MemCategory::activations, 20000);
    small = x.data();
    large = y.data();
  }
  ASSERT_EQ(a.kept_bytes(), 34096u);
  // 3000 bytes: the 4096-byte block (the smallest of at least 3000), zeroed over what was asked for.
  Buffer b = a.alloc(MemCategory::activations, 3000);
  EXPECT_EQ(b.data(), small);
  EXPECT_EQ(a.kept_bytes(), 30000u);
  EXPECT_EQ(a.stats().live_total, 3000u);  // the arena counts what was asked for
  const auto* bytes = static_cast<const unsigned char*>(b.data());
  for (size_t k = 0; k < 3000; k++) ASSERT_EQ(bytes[k], 0) << "byte " << k;
  // 4500 bytes: the smallest kept block (10000) is more than twice that, so a new block.
  Buffer c = a.alloc(MemCategory::activations, 4500);
  EXPECT_NE(c.data(), large);
  // 4096 + 4500 live and 30000 kept are more than an eighth over the 34096 ever held (38358): the
  // largest kept block goes.
  EXPECT_EQ(a.kept_bytes(), 10000u);
  // Freed, the reused block goes back at its own size and serves a request of that size.
  b.reset();
  EXPECT_EQ(a.kept_bytes(), 14096u);
  Buffer d = a.alloc_uninitialized(MemCategory::activations, 4096);
  EXPECT_EQ(d.data(), small);
}

TEST(Arena, KeptBlocksNeverTakeTheHeldTotalMoreThanAnEighthOverTheMostEverLive) {
  Arena a;
  {
    Buffer x = a.alloc(MemCategory::activations, 1000), y = a.alloc(MemCategory::activations, 2000),
           z = a.alloc(MemCategory::activations, 3000);
  }
  EXPECT_EQ(a.kept_bytes(), 6000u);
  a.reset_peaks();  // the bound is the most ever live, not this phase's peak
  // A size the cache does not hold: kept blocks go, largest first, until live + kept <= 6000 + 6000 / 8.
  Buffer w = a.alloc(MemCategory::activations, 5000);
  EXPECT_EQ(a.kept_bytes(), 1000u);
  Buffer v = a.alloc(MemCategory::activations, 1000);  // served from the cache
  EXPECT_EQ(a.kept_bytes(), 0u);
  EXPECT_EQ(a.stats().live_total, 6000u);
}

// A step's one-off request of a size the cache does not hold (GPT-2's classifier chunk, 51 MB against
// a 2.6 GB step) used to push out blocks the rest of the step needed, which were then allocated fresh
// (page faults and a poisoning pass) and pushed the chunk's block out in turn, every step.
TEST(Arena, AOneOffRequestWithinTheHeadroomEvictsNothing) {
  Arena a;
  {
    std::vector<Buffer> step;
    for (int i = 0; i < 8; i++) step.push_back(a.alloc(MemCategory::activations, 1000));
  }
  ASSERT_EQ(a.kept_bytes(), 8000u);  // the most ever live: 8000; the headroom 1000
  {
    Buffer chunk = a.alloc(MemCategory::activations, 400);  // too small for a kept 1000 (over twice it)
    EXPECT_EQ(a.kept_bytes(), 8000u) << "8400 held is within 8000 + 1000: nothing evicted";
  }
  EXPECT_EQ(a.kept_bytes(), 8400u);
  {
    std::vector<Buffer> step;  // the next step finds every block it needs
    for (int i = 0; i < 8; i++) step.push_back(a.alloc(MemCategory::activations, 1000));
    Buffer chunk = a.alloc(MemCategory::activations, 400);
    EXPECT_EQ(a.kept_bytes(), 0u);
  }
  // Fresh: 1500 + 8400 kept is over the most ever live (now 8400) + 1050.
  Buffer big = a.alloc(MemCategory::activations, 1500);
  EXPECT_LE(big.bytes() + a.kept_bytes(), 8400u + 1050u);
  EXPECT_EQ(a.kept_bytes(), 7400u);  // the largest kept blocks went first: one 1000
}

TEST(Arena, CustomAllocatorIsUsedAndFailureNamesTheCategory) {
  int allocs = 0, frees = 0;
  {
    Arena a(
        [&](size_t n) {
          allocs++;
          return std::malloc(n);
        },
        [&](void* p) {
          frees++;
          std::free(p);
        });
    Buffer b1 = a.alloc(MemCategory::optimizer, 128), b2 = a.alloc(MemCategory::optimizer, 128);
    EXPECT_EQ(allocs, 2);
    b1.reset();
    EXPECT_EQ(frees, 1);
  }
  EXPECT_EQ(frees, 2);

  Arena full([](size_t) -> void* { return nullptr; }, [](void*) {});
  try {
    full.alloc(MemCategory::optimizer, 1 << 20);
    FAIL() << "no error when the allocator returns nullptr";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer"), std::string::npos) << e.what();
  }
  EXPECT_EQ(full.stats().live_total, 0u);
}

TEST(Arena, FormatBytesUsesBinaryUnits) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(size_t(3) << 20), "3.0 MiB");
  EXPECT_EQ(format_bytes(size_t(5) << 30), "5.00 GiB");
}

TEST(ParamStore, OffsetsAreAlignedAndUnitsPaddedToWholeShards) {
  std::mt19937_64 rng(mt::testing::test_seed() + 1);
  for (int shards : {1, 3, 4}) {
    SCOPED_TRACE(::testing::Message() << shards << " shards");
    ParamStore ps;
    int64_t unpadded = 0;
    for (int i = 0; i < 30; i++) {
      if (i % 7 == 0) ps.begin_unit(strfmt("unit%d", i / 7));
      std::vector<int64_t> shape;
      const int ndim = 1 + int(rng() % 3);
      for (int d = 0; d < ndim; d++) shape.push_back(1 + int64_t(rng() % 19));
      EXPECT_EQ(ps.add(strfmt("p%d", i), shape, i % 2 == 0), i);
    }
    Arena a;
    ps.finalize(a, DType::f32, shards);
    const auto& es = ps.entries();
    const auto& us = ps.units();
    ASSERT_EQ(us.size(), 5u);
    for (size_t i = 0; i < es.size(); i++) {
      int64_t numel = 1;
      for (int64_t d : es[i].shape) numel *= d;
      unpadded += numel;
      EXPECT_EQ(es[i].numel, numel);
      EXPECT_EQ(es[i].unit, int(i / 7));
      EXPECT_EQ(es[i].offset % 16, 0) << es[i].name;
      EXPECT_EQ(es[i].global_shape, es[i].shape);
      EXPECT_TRUE(es[i].box.whole()) << es[i].name;
      EXPECT_EQ(es[i].weight_decay, i % 2 == 0);
      const ParamUnit& u = us[size_t(es[i].unit)];
      EXPECT_GE(es[i].offset, u.begin);
      EXPECT_LE(es[i].offset + es[i].numel, u.end) << es[i].name << " leaves its unit";
      const bool last_in_unit = i + 1 == es.size() || es[i + 1].unit != es[i].unit;
      const int64_t next = last_in_unit ? u.end : es[i + 1].offset;
      EXPECT_LE(es[i].offset + es[i].numel, next) << es[i].name << " overlaps the next entry";
      if (!last_in_unit) {
        EXPECT_LT(next - (es[i].offset + es[i].numel), 16) << "padding after " << es[i].name;
      }
    }
    for (size_t u = 0; u < us.size(); u++) {
      EXPECT_EQ(us[u].begin, u == 0 ? 0 : us[u - 1].end) << "units must tile the flat range";
      EXPECT_EQ(us[u].size() % (16 * shards), 0) << us[u].name;  // every shard chunk 64-byte aligned
    }
    EXPECT_EQ(ps.total_numel(), us.back().end);
    EXPECT_EQ(ps.param_count(), unpadded);
    ASSERT_NE(ps.find("p7"), nullptr);
    EXPECT_EQ(ps.find("p7")->offset, es[7].offset);
    EXPECT_EQ(ps.find("missing"), nullptr);

    const size_t bytes = size_t(ps.total_numel()) * sizeof(float);
    EXPECT_EQ(live(a, MemCategory::params), bytes);  // fp32: the master is also the compute copy
    EXPECT_EQ(ps.compute(), ps.master());
    EXPECT_EQ(live(a, MemCategory::grads), bytes);
    for (int i = 0; i < int(es.size()); i++) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(ps.master(i)) % 64, 0u);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(ps.grad(i)) % 64, 0u);
      EXPECT_EQ(ps.compute_as<float>(i) - ps.master(), es[size_t(i)].offset);
    }
  }
}

TEST(ParamStore, WithoutMaterializeOnlyTheMasterIsAllocated) {
  ParamStore ps;
  ps.add("w", {5, 7}, true);
  Arena a;
  ps.finalize(a, DType::bf16, 2, Storage::per_unit);
  EXPECT_EQ(live(a, MemCategory::params), size_t(ps.total_numel()) * sizeof(float));
  EXPECT_EQ(live(a, MemCategory::grads), 0u);
  EXPECT_EQ(ps.compute(), nullptr);
  EXPECT_EQ(ps.grads(), nullptr);
  EXPECT_THROW(ps.compute_as<mt::bf16>(0), Error);  // the unit is not materialised
  EXPECT_THROW(ps.compute_as<float>(0), Error);     // nor are its weights fp32
}

TEST(ParamStore, MisuseIsRejected) {
  ParamStore ps;
  ps.add("w", {3, 4}, true);
  EXPECT_THROW(ps.add("w", {2}, true), Error);     // registered twice
  EXPECT_THROW(ps.add("z", {3, 0}, true), Error);  // empty dimension
  Arena a;
  ps.finalize(a, DType::bf16);
  EXPECT_THROW(ps.add("late", {2}, true), Error);    // after finalize
  EXPECT_THROW(ps.finalize(a, DType::bf16), Error);  // twice
}

TEST(ParamStore, RefreshComputeRoundsMasterToTheComputeDtypeAndZeroGradsClears) {
  std::mt19937_64 rng(mt::testing::test_seed() + 2);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    ParamStore ps;
    ps.add("a", {37, 5}, true);
    ps.add("b", {11}, false);
    Arena a;
    ps.finalize(a, t);
    EXPECT_EQ(ps.compute_dtype(), t);
    // The master in fp32, the compute copy in t (sharing the master's buffer in fp32): 4 or 6 bytes.
    EXPECT_EQ(live(a, MemCategory::params), size_t(ps.total_numel()) * (t == DType::f32 ? 4 : 6));
    auto vals = mt::testing::random_floats(size_t(ps.total_numel()), rng, -70000.f, 70000.f);
    vals[3] = 1e-6f;  // an f16 subnormal
    std::copy(vals.begin(), vals.end(), ps.master());
    for (int i = 0; i < 2; i++) std::fill_n(ps.grad(i), ps.entry(i).numel, 1.f);  // padding stays zero
    ps.refresh_compute();
    for (int64_t i = 0; i < ps.total_numel(); i++) {
      const float m = vals[size_t(i)];
      const float want = t == DType::bf16 ? round_bf16(m) : t == DType::f16 ? round_f16(m) : m;
      ASSERT_EQ(ps.master()[i], m) << "master changed";
      const float got = t == DType::bf16  ? load(static_cast<const mt::bf16*>(ps.compute())[i])
                        : t == DType::f16 ? load(static_cast<const mt::f16*>(ps.compute())[i])
                                          : static_cast<const float*>(ps.compute())[i];
      ASSERT_EQ(got, want) << dtype_name(t) << " element " << i;
    }
    ps.zero_grads();
    for (int64_t i = 0; i < ps.total_numel(); i++) ASSERT_EQ(ps.grads()[i], 0.f);
  }
}

// zero_grads writes nothing: each entry's first writer either sets the whole of it (grad_for_write
// with the entry's numel: assign, the stale contents neither zeroed nor read) or finds it zeroed
// (grad, grad_for_write with another count, unit_grads, grads, grads_settled over a range that meets
// it, settle_grads). Entries outside a settled range keep waiting; padding is never touched.
TEST(ParamStore, ZeroGradsLeavesEachEntryToItsFirstWriter) {
  ParamStore ps;
  ps.begin_unit("u0");
  const int a = ps.add("a", {37, 5}, true), b = ps.add("b", {11}, false);
  ps.begin_unit("u1");
  const int c = ps.add("c", {16}, true), d = ps.add("d", {3, 3}, true);
  Arena arena;
  ps.finalize(arena, DType::f32);
  const auto stale = [&](int i) { std::fill_n(ps.grad(i), ps.entry(i).numel, 7.f); };
  const auto all_are = [&](int i, float v) {
    const float* g = ps.grads_settled(0, 0) + ps.entry(i).offset;  // an empty range settles nothing
    return std::all_of(g, g + ps.entry(i).numel, [v](float x) { return x == v; });
  };
  for (int i : {a, b, c, d}) stale(i);
  ps.zero_grads();
  bool assign = false;
  float* pa = ps.grad_for_write(a, 185, &assign);
  EXPECT_TRUE(assign) << "the first whole write assigns";
  EXPECT_EQ(pa, ps.grads_settled(0, 0) + ps.entry(a).offset);
  EXPECT_TRUE(all_are(a, 7.f)) << "an assigned entry is not zeroed first";
  ps.grad_for_write(a, 185, &assign);
  EXPECT_FALSE(assign) << "the second write adds";
  EXPECT_TRUE(all_are(b, 7.f)) << "b still waits";
  ps.grad_for_write(c, 15, &assign);
  EXPECT_FALSE(assign) << "a partial write cannot assign";
  EXPECT_TRUE(all_are(c, 0.f)) << "so the entry is zeroed for it";
  ps.grad_for_write(c, 16, &assign);
  EXPECT_FALSE(assign) << "c is written already";
  EXPECT_TRUE(all_are(d, 7.f));
  ps.unit_grads(1);  // settles d, the rest of unit 1
  EXPECT_TRUE(all_are(d, 0.f));
  EXPECT_TRUE(all_are(b, 7.f)) << "unit 0 untouched";
  EXPECT_EQ(ps.grad(b)[0], 0.f) << "an accumulating writer finds zeros";

  for (int i : {a, b, c, d}) stale(i);
  ps.zero_grads();
  ps.grads_settled(ps.entry(b).offset, ps.entry(b).offset + 1);
  EXPECT_TRUE(all_are(b, 0.f));
  EXPECT_TRUE(all_are(a, 7.f) && all_are(c, 7.f) && all_are(d, 7.f)) << "only the range's entries are settled";
  ps.settle_grads();
  for (int i : {a, c, d}) EXPECT_TRUE(all_are(i, 0.f)) << ps.entry(i).name;
  ps.grad_for_write(d, 9, &assign);
  EXPECT_FALSE(assign) << "settled: the entry is no longer waiting";

  for (int i : {a, b, c, d}) stale(i);
  ps.zero_grads();
  const float* g = ps.grads();  // every waiting entry zeroed
  for (int64_t i = 0; i < ps.total_numel(); i++) ASSERT_EQ(g[i], 0.f) << "element " << i;

  // Per-unit gradients are their owner's to zero: nothing waits, nothing is assigned.
  ParamStore pu;
  pu.add("w", {5, 7}, true);
  Arena arena2;
  pu.finalize(arena2, DType::f32, 1, Storage::per_unit_grads);
  std::vector<float> unit(size_t(pu.units()[0].size()), 3.f);
  pu.set_unit_grads(0, unit.data());
  EXPECT_EQ(pu.grad_for_write(0, 35, &assign), unit.data());
  EXPECT_FALSE(assign);
  EXPECT_EQ(unit[0], 3.f);
}

}  // namespace
}  // namespace mt
