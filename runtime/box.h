// Boxes: an n-dimensional block of a row-major tensor, and the contiguous runs of the tensor's flat
// index that its elements form. A parallel layout gives each rank a box of a split parameter
// (runtime/param_store.h); a checkpoint stores a box with its own geometry (checkpoint/format.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace mt {

// Where a parameter sits in the whole model when a parallel layout splits it. The rank's local tensor
// is a BOX of the global one: `extent` elements from `offset` along each dimension of `space`, in
// row-major order. `space` is the global shape, or the same elements seen with more dimensions where
// that turns a rank's part into one box: c_attn's (3C, C) weight seen as (3, C, C), so that a
// tensor-parallel rank's heads (the same rows of q, k and v) are the box (3, C/tp, C) at (0, r C/tp, 0).
struct ParamBox {
  std::vector<int64_t> space, offset, extent;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : extent) n *= d;
    return n;
  }
  bool whole() const { return extent == space; }
  // The box is a set of equal runs: dimensions from split_dim() on are contiguous in the global
  // tensor (every later dimension is whole), so one run is extent[split] x (the later dims' sizes).
  int split_dim() const {
    int d = int(space.size()) - 1;
    while (d > 0 && extent[size_t(d)] == space[size_t(d)]) d--;
    return d;
  }
  // Elements per contiguous run (every run of a box has this length): numel() for a single run.
  int64_t run_length() const {
    if (space.empty()) return 1;
    int64_t n = 1;
    for (size_t d = size_t(split_dim()); d < space.size(); d++) n *= d == size_t(split_dim()) ? extent[d] : space[d];
    return n;
  }
};

// Calls f(global_begin, global_end, local_pos) for each contiguous run of the global tensor's flat
// index space that the box's elements [local_begin, local_end) (in the box's own row-major order)
// cover, in order; local_pos is where the run starts in the box's flat index. A whole box is one run.
template <class F>
void for_each_box_run(const ParamBox& b, int64_t local_begin, int64_t local_end, F f) {
  if (local_begin >= local_end) return;
  const int nd = int(b.space.size());
  const int split = b.split_dim();
  std::vector<int64_t> stride(size_t(nd), 1);
  for (int d = nd - 2; d >= 0; d--) stride[size_t(d)] = stride[size_t(d) + 1] * b.space[size_t(d) + 1];
  const int64_t run = b.run_length();
  for (int64_t r = local_begin / run; r * run < local_end; r++) {
    // The global start of run r: its index over the dimensions before `split`, plus the box's offsets.
    int64_t g = 0, rest = r;
    for (int d = split; d >= 0; d--) {
      const int64_t i = d == split ? 0 : rest % b.extent[size_t(d)];
      if (d != split) rest /= b.extent[size_t(d)];
      g += (b.offset[size_t(d)] + i) * stride[size_t(d)];
    }
    const int64_t lo = std::max(local_begin, r * run), hi = std::min(local_end, (r + 1) * run);
    f(g + (lo - r * run), g + (hi - r * run), lo);
  }
}

}  // namespace mt
