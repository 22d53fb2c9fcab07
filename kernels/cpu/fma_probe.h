// The CPU's arithmetic peak, measured: independent chains of fused multiply-adds on registers alone
// (no loads or stores), on `threads` threads at once, with the widest vector unit the built-in GEMM
// uses (AVX-512, else AVX2 with FMA; otherwise a plain multiply-add loop the compiler vectorises).
// It is to the CPU what the datasheet peak is to a GPU: cores x clock x FLOPs per cycle, read from
// the hardware rather than from a table, so it moves with the clock the machine runs at. MFU
// against it says how close a step comes to the cores' limit whoever wrote the GEMM; bench prints
// it beside MFU against the calibrated GEMM (docs/guide.md).
#pragma once

namespace mt::cpu {

struct FmaPeak {
  double flops = 0;           // FLOP/s over all threads (an FMA counts two)
  const char* unit = "";      // "AVX-512", "AVX2", "portable"
};

// The best rate of at least 4 repetitions lasting at least min_seconds in all.
FmaPeak measure_fma_peak(int threads, double min_seconds = 0.1);

}  // namespace mt::cpu
