// The fixed-order reduction that host backends apply to the blocks they receive.
//
// out[i] = op(blocks[0][i], blocks[1][i], ..., blocks[n-1][i]), combined left to right in block
// (= rank) order, so the result is a pure function of the inputs: independent of the MPI library's
// algorithm choice, the message arrival order and the thread count.
//
// Precision: f32, bf16 and f16 inputs are widened to fp32 and accumulated in fp32; avg divides the
// fp32 sum by n; the result is rounded (round to nearest even) to bf16/f16 exactly once, when it is
// stored to `out`. i32 sums wrap modulo 2^32. max propagates NaN.
#pragma once
#include <cstddef>

#include "parallel/comm.h"

namespace mt::parallel {

// blocks: n consecutive blocks of `count` elements of type t. out (count) must not overlap blocks.
void reduce_blocks(void* out, const void* blocks, int n, size_t count, DType t, ReduceOp op);

}  // namespace mt::parallel
