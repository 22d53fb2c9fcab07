// The FLOP accounting behind MFU and HFU (model/config.h): HFU adds exactly the products each
// recompute mode and attention path re-executes, on the backend that runs them.
#include <gtest/gtest.h>

#include "model/config.h"

namespace mt::model {
namespace {

TEST(HardwareFlops, AddWhatEachPathRecomputes) {
  const model::GPTConfig cfg = model::GPTConfig::preset("gpt2");
  const int T = 1024;
  const double L = cfg.n_layer, C = cfg.n_embd;
  const double model_flops = cfg.flops_per_token(T);
  const double product = 2.0 * L * C * T;                // one T x T attention product per token
  const double layer_forward = 2.0 * (12.0 * L * C * C);  // the block GEMMs of one forward
  auto hw = [&](Recompute r, Attention a, Device d) { return hardware_flops_per_token(cfg, T, r, a, d); };

  EXPECT_DOUBLE_EQ(hw(Recompute::none, Attention::materialized, Device::cpu), model_flops);
  EXPECT_DOUBLE_EQ(hw(Recompute::selective, Attention::materialized, Device::cpu), model_flops + 2 * product);
  EXPECT_DOUBLE_EQ(hw(Recompute::full, Attention::materialized, Device::cuda),
                   model_flops + layer_forward + 2 * product);
  // Flash: Q K^T once more on the CPU; Q K^T twice and dO V^T once more on the GPU (two kernels, no
  // atomics). Selective recompute adds nothing on top of that.
  EXPECT_DOUBLE_EQ(hw(Recompute::none, Attention::flash, Device::cpu), model_flops + product);
  EXPECT_DOUBLE_EQ(hw(Recompute::none, Attention::flash, Device::cuda), model_flops + 3 * product);
  EXPECT_DOUBLE_EQ(hw(Recompute::selective, Attention::flash, Device::cuda), model_flops + 3 * product);
  EXPECT_DOUBLE_EQ(hw(Recompute::full, Attention::flash, Device::cuda),
                   model_flops + layer_forward + 2 * product + 3 * product);
}

}  // namespace
}  // namespace mt::model
