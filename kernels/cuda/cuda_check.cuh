// Status checks for the CUDA backend: every runtime call, every kernel launch and every cuBLASLt call
// goes through one of these, so a failure names the statement, the file and the line (and stays on in
// release builds, like MT_CHECK).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "runtime/check.h"

#define MT_CUDA_CHECK(stmt)                                                                          \
  do {                                                                                               \
    cudaError_t mt_cuda_err_ = (stmt);                                                               \
    if (mt_cuda_err_ != cudaSuccess)                                                                 \
      ::mt::detail::throw_status("CUDA", #stmt, __FILE__, __LINE__, long(mt_cuda_err_),              \
                                 cudaGetErrorString(mt_cuda_err_));                                  \
  } while (0)

// After a <<<...>>> launch: catches bad launch configurations immediately (errors inside the kernel
// surface at the next synchronising call, which is checked too).
#define MT_CUDA_CHECK_LAUNCH() MT_CUDA_CHECK(cudaGetLastError())

#define MT_CUBLAS_CHECK(stmt)                                                                        \
  do {                                                                                               \
    cublasStatus_t mt_cublas_st_ = (stmt);                                                           \
    if (mt_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      ::mt::detail::throw_status("cuBLAS", #stmt, __FILE__, __LINE__, long(mt_cublas_st_),           \
                                 cublasLtGetStatusString(mt_cublas_st_));                            \
  } while (0)
