// The selftest's last check: one whole training step on each backend. The op checks prove each kernel
// alone; this proves they are wired together (the model's buffers, weight conversions, the optimizer
// on device memory, the loss coming back) the way the CPU reference wires them. A small GPT, synthetic
// tokens, the same seed on both backends, in fp32 and bf16; attention is each backend's default
// (flash on the GPU, materialised on the CPU), so the two attention paths are compared as well.
//
// Compared: the losses of two steps, the gradient norm of the first, and the master weights after the
// first. Tolerances: fp32 losses and norms differ by summation order only; bf16 activations differ by
// a flipped rounding here and there, a few bf16 units (2^-8) at most. After one AdamW step every weight
// has moved by lr * m_hat / (sqrt(v_hat) + eps), at most lr in magnitude, so however the two
// backends' gradients differ the weights cannot differ by more than 2 lr: the bound used (relative to
// the largest weight), which a wrong update (or none) exceeds.
#ifdef MT_HAVE_CUDA
#include <filesystem>
#include <string>
#include <vector>

#include "cli/selftest_checker.h"
#include "train/trainer.h"

namespace mt::cli::selftest_detail {

namespace {

constexpr float kLr = 1e-3f;

config::TrainOptions step_options(const std::string& device, const std::string& precision, uint64_t seed,
                          const std::string& out) {
  return config::parse_train_options({"model=tiny", "model.vocab_size=512", "model.n_layer=2", "model.n_embd=64",
                              "model.n_head=4", "model.block_size=64", "batch_size=4", "seq_len=64", "steps=2",
                              "data.path=synthetic", "optim.warmup_steps=0", "optim.lr=" + std::to_string(kLr),
                              "precision=" + precision, "device=" + device, "seed=" + std::to_string(seed),
                              "out_dir=" + out});
}

struct StepRecord {
  std::vector<float> losses, grad_norms, weights;
};

StepRecord two_steps(const config::TrainOptions& o) {
  train::Trainer t(o);
  StepRecord r;
  const train::StepResult first = t.step();
  r.losses.push_back(float(first.loss));
  r.grad_norms.push_back(float(first.grad_norm));
  r.weights = t.full_master();
  r.losses.push_back(float(t.step().loss));
  return r;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

}  // namespace

void check_train_step(Checker& c) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("minitrain_selftest_" + std::to_string(c.rng()));
  const uint64_t seed = c.rng() % 1000000;
  struct Case {
    const char* precision;
    const char* dtype;
    double loss_tol, norm_tol;
  };
  for (const Case& k : {Case{"fp32", "f32", 1e-4, 1e-4}, Case{"bf16", "bf16", 4.0 / 256, 4.0 / 256}}) {
    c.at("L=2 C=64 NH=4 V=512 B=4 T=64", k.dtype);
    const StepRecord cpu = two_steps(step_options("cpu", k.precision, seed, (dir / "cpu").string()));
    const StepRecord gpu = two_steps(step_options("cuda", k.precision, seed, (dir / "gpu").string()));
    c.rel("losses (2 steps)", gpu.losses, cpu.losses, k.loss_tol);
    c.rel("grad norm", gpu.grad_norms, cpu.grad_norms, k.norm_tol);
    c.rel("weights after 1", gpu.weights, cpu.weights, 2.0 * kLr / std::max(max_abs(cpu.weights), 1e-30f));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);  // best effort: the runs write nothing but their directories
}

}  // namespace mt::cli::selftest_detail
#endif  // MT_HAVE_CUDA
