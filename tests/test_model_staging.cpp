// The model's memory traffic on a device backend, checked on the CPU: with an arena whose memory says
// it is a device (but is host memory underneath, so the CPU ops can still run on it), the model
// uploads the initial weights and every micro-batch array through the arena's MemOps, downloads only
// the per-row losses (or the last logits), and computes bitwise the same results as on plain host
// memory. A step that bypassed the MemOps would read host pointers on a real GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "model/gpt.h"
#include "tests/test_util.h"

namespace mt::model {
namespace {

// Bytes moved per direction by the fake device memory. MemOps holds plain function pointers, so the
// fake's counters live at file scope; each test resets them first.
struct Traffic {
  size_t up = 0, down = 0, within = 0, zeroed = 0, narrowed = 0;  // narrowed: elements
};
Traffic g_traffic;

void fake_copy(void* dst, const void* src, size_t bytes, CopyKind kind) {
  if (kind == CopyKind::host_to_device) g_traffic.up += bytes;
  if (kind == CopyKind::device_to_host) g_traffic.down += bytes;
  if (kind == CopyKind::device_to_device) g_traffic.within += bytes;
  host_memory().copy(dst, src, bytes, kind);
}

void fake_zero(void* p, size_t bytes) {
  g_traffic.zeroed += bytes;
  host_memory().zero(p, bytes);
}

void fake_narrow(void* dst, const float* src, int64_t n, DType t) {
  g_traffic.narrowed += size_t(n);
  host_memory().narrow(dst, src, n, t);
}

MemOps fake_device() {
  MemOps m = host_memory();
  m.device = Device::cuda;
  m.copy = fake_copy;
  m.zero = fake_zero;
  m.narrow = fake_narrow;
  return m;
}

GPTConfig small_config() {
  GPTConfig cfg;
  cfg.vocab_size = 97;
  cfg.block_size = 16;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  return cfg;
}

struct Batch {
  int B = 3, T = 16;
  std::vector<int32_t> tokens, targets, positions, docs;
  MicroBatch view() const { return {B, T, tokens.data(), targets.data(), positions.data(), docs.data()}; }
};

Batch random_batch(const GPTConfig& cfg, std::mt19937_64& rng) {
  Batch b;
  const size_t n = size_t(b.B * b.T);
  std::uniform_int_distribution<int32_t> tok(0, cfg.vocab_size - 1);
  for (size_t i = 0; i < n; i++) {
    b.tokens.push_back(tok(rng));
    b.targets.push_back(rng() % 7 == 0 ? -1 : tok(rng));  // some ignored positions
    const int t = int(i) % b.T;
    const int split = b.T / 2;  // two packed documents per row, positions restarting at the second
    b.positions.push_back(t < split ? t : t - split);
    b.docs.push_back(t < split ? 0 : 1);
  }
  return b;
}

struct Result {
  double loss = 0;
  std::vector<float> grads, logits;
};

Result train_once(const MemOps& mem, const GPTConfig& cfg, const Batch& b, DType precision) {
  Arena arena(mem);
  ParamStore store;
  GPT gpt(cfg, store);
  store.finalize(arena, precision);
  gpt.init_weights(7);
  gpt.set_arena(&arena);
  store.zero_grads();
  Result r;
  r.loss = gpt.forward_backward(b.view(), 1.f / float(b.B * b.T));
  r.grads.assign(store.grads(), store.grads() + store.total_numel());
  r.logits.resize(size_t(cfg.vocab_size));
  gpt.forward_last_logits(b.view(), r.logits.data());
  return r;
}

class DeviceStaging : public ::testing::TestWithParam<DType> {};

TEST_P(DeviceStaging, ResultsAreBitwiseThoseOfHostMemory) {
  const GPTConfig cfg = small_config();
  std::mt19937_64 rng(testing::test_seed());
  const Batch b = random_batch(cfg, rng);
  const Result host = train_once(host_memory(), cfg, b, GetParam());
  const Result dev = train_once(fake_device(), cfg, b, GetParam());
  EXPECT_EQ(host.loss, dev.loss);
  ASSERT_EQ(host.grads.size(), dev.grads.size());
  EXPECT_EQ(0, std::memcmp(host.grads.data(), dev.grads.data(), host.grads.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(host.logits.data(), dev.logits.data(), host.logits.size() * sizeof(float)));
}

TEST_P(DeviceStaging, EveryHostArrayCrossesThroughTheArenasMemOps) {
  const GPTConfig cfg = small_config();
  std::mt19937_64 rng(testing::test_seed() + 1);
  const Batch b = random_batch(cfg, rng);
  g_traffic = Traffic();
  const MemOps mem = fake_device();
  Arena arena(mem);
  ParamStore store;
  GPT gpt(cfg, store);
  store.finalize(arena, GetParam());
  const size_t params = size_t(store.total_numel()) * sizeof(float);
  const size_t n = size_t(b.B * b.T) * sizeof(int32_t);

  gpt.init_weights(7);  // the master goes up once; a 16-bit run's compute copy is derived on the device
  EXPECT_EQ(g_traffic.up, params);
  EXPECT_EQ(g_traffic.within, 0u);
  // fp32: the master is the compute copy; 16-bit: rounded from it once, element by element.
  EXPECT_EQ(g_traffic.narrowed, GetParam() == DType::f32 ? 0u : size_t(store.total_numel()));
  EXPECT_EQ(g_traffic.down, 0u);

  g_traffic = Traffic();
  gpt.set_arena(&arena);
  store.zero_grads();
  EXPECT_EQ(g_traffic.zeroed, 0u) << "the gradients wait for their first writers";
  gpt.forward_backward(b.view(), 1.f);
  // The weight matrices' GEMMs write theirs over; the rest (biases, LayerNorms, wpe, whose writers
  // add) are zeroed first, entry by entry.
  size_t added = 0;
  for (const ParamEntry& e : store.entries())
    if (e.shape.size() != 2 || e.name.find("wpe") != std::string::npos) added += size_t(e.numel) * sizeof(float);
  EXPECT_EQ(g_traffic.zeroed, added);
  EXPECT_LT(added, params / 2);
  EXPECT_EQ(g_traffic.up, 4 * n) << "tokens, targets, positions and document ids";
  EXPECT_EQ(g_traffic.down, size_t(b.B * b.T) * sizeof(float)) << "only the per-row losses come back";

  g_traffic = Traffic();
  std::vector<float> logits(size_t(cfg.vocab_size));
  gpt.forward_last_logits(MicroBatch{b.B, b.T, b.tokens.data(), nullptr, nullptr, nullptr}, logits.data());
  EXPECT_EQ(g_traffic.up, n) << "tokens only";
  EXPECT_EQ(g_traffic.down, size_t(cfg.vocab_size) * sizeof(float));
}

// A pipeline's last stage keeps its losses on the device (GPT::set_keep_stage_losses): its backward
// downloads nothing, and the losses it hands over sum, in the model's own order, to the very loss the
// unkept path returns; taking them twice, or from a backward that did not keep them, fails.
TEST_P(DeviceStaging, KeptStageLossesStayOnTheDevice) {
  const GPTConfig cfg = small_config();
  std::mt19937_64 rng(testing::test_seed() + 2);
  const Batch b = random_batch(cfg, rng);
  const Result want = train_once(fake_device(), cfg, b, GetParam());
  Arena arena(fake_device());
  ParamStore store;
  GPT gpt(cfg, store);
  store.finalize(arena, GetParam());
  gpt.init_weights(7);
  gpt.set_arena(&arena);
  store.zero_grads();
  gpt.set_keep_stage_losses(true);
  g_traffic = Traffic();
  std::unique_ptr<StageContext> ctx = gpt.stage_forward(0, b.view(), Buffer(), 1.f / float(b.B * b.T), true);
  EXPECT_FALSE(gpt.stage_backward(*ctx, Buffer())) << "stage 0 has no input gradient";
  EXPECT_EQ(g_traffic.down, 0u) << "the losses stay in device memory";
  const Buffer losses = gpt.take_stage_losses(*ctx);
  ASSERT_EQ(losses.bytes(), size_t(b.B * b.T) * sizeof(float));
  double sum = 0;
  for (int i = 0; i < b.B * b.T; i++) sum += double(losses.f32()[i]);
  EXPECT_EQ(sum, want.loss);
  EXPECT_EQ(0, std::memcmp(store.grads(), want.grads.data(), want.grads.size() * sizeof(float)));
  EXPECT_THROW(gpt.take_stage_losses(*ctx), Error);
  gpt.set_keep_stage_losses(false);
  std::unique_ptr<StageContext> plain = gpt.stage_forward(0, b.view(), Buffer(), 1.f, true);
  gpt.stage_backward(*plain, Buffer());
  EXPECT_THROW(gpt.take_stage_losses(*plain), Error);
}

INSTANTIATE_TEST_SUITE_P(Precisions, DeviceStaging, ::testing::Values(DType::f32, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

}  // namespace
}  // namespace mt::model
