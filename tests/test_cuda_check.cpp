// What the CUDA backend promises without a GPU: device discovery answers 0 instead of failing, and the
// status macros name the statement, the library, the code and where it happened. These run on every
// machine that builds the CUDA backend.
#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace {

TEST(CudaCheck, DeviceCountNeverThrowsOnAMachineWithoutAGpu) {
  int n = -1;
  EXPECT_NO_THROW(n = mt::cuda::device_count());
  EXPECT_GE(n, 0);
}

TEST(CudaCheck, CudaErrorNamesStatementCodeFileAndLine) {
  try {
    MT_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "MT_CUDA_CHECK did not throw on an error status";
  } catch (const mt::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("CUDA error 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("`cudaErrorInvalidValue`"), std::string::npos) << msg;
    EXPECT_NE(msg.find(cudaGetErrorString(cudaErrorInvalidValue)), std::string::npos) << msg;
    EXPECT_NE(msg.find("test_cuda_check.cpp:"), std::string::npos) << msg;
  }
}

TEST(CudaCheck, CublasErrorNamesStatementAndCode) {
  try {
    MT_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
    FAIL() << "MT_CUBLAS_CHECK did not throw on an error status";
  } catch (const mt::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuBLAS error " + std::to_string(int(CUBLAS_STATUS_NOT_SUPPORTED))), std::string::npos) << msg;
    EXPECT_NE(msg.find("`CUBLAS_STATUS_NOT_SUPPORTED`"), std::string::npos) << msg;
  }
}

TEST(CudaCheck, SuccessDoesNotThrow) {
  EXPECT_NO_THROW(MT_CUDA_CHECK(cudaSuccess));
  EXPECT_NO_THROW(MT_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));
}

}  // namespace
