// The training loop: data -> forward/backward over micro-batches -> unscale/clip -> AdamW -> metrics,
// with evaluation, training-state save/resume and HF export.
#pragma once
#include <memory>
#include <string>

#include "model/gpt.h"
#include "runtime/arena.h"
#include "runtime/param_store.h"
#include "train/batches.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/options.h"

namespace mt::train {

struct StepResult {
  double loss = 0;        // mean loss of the global batch
  double grad_norm = 0;   // before clipping (unscaled)
  float lr = 0;
  bool skipped = false;   // fp16 overflow: no update
  int tokens = 0;         // tokens processed (all micro-batches)
  double t_data = 0, t_forward = 0, t_backward = 0, t_optimizer = 0, t_total = 0;
};

class Trainer {
 public:
  // Builds everything and checks every input; writes nothing.
  explicit Trainer(const TrainOptions& o);
  ~Trainer();

  // The whole run: creates out_dir (refusing to overwrite another run unless resuming), writes the
  // resolved config, trains to o.steps with logs/eval/saves, then saves the final state and
  // exports <out_dir>/model.safetensors.
  void run();

  StepResult step();      // one optimizer step
  double evaluate();      // mean validation loss over the first eval_batches validation batches
  int step_count() const { return step_; }

  // Full training state (weights, AdamW moments, step, update count, loss scale, data position),
  // written atomically; load restores it so that training continues bitwise identically.
  void save_state(const std::string& path) const;
  void load_state(const std::string& path);

  model::GPT& model() { return *gpt_; }
  ParamStore& params() { return store_; }
  Arena& arena() { return arena_; }
  const TrainOptions& options() const { return o_; }

 private:
  TrainOptions o_;
  Arena arena_;
  ParamStore store_;
  std::unique_ptr<model::GPT> gpt_;
  std::unique_ptr<AdamW> adam_;
  LossScaler scaler_;
  std::unique_ptr<BatchSource> train_data_, val_data_;
  std::vector<HostBatch> micro_;
  ops::Ctx ctx_;
  int step_ = 0;     // optimizer steps taken (including fp16-skipped ones)
  int updates_ = 0;  // AdamW updates applied (the bias-correction count)
};

}  // namespace mt::train
