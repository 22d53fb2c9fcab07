#include "train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "model/hf_io.h"
#include "runtime/check.h"
#include "runtime/safetensors.h"

namespace mt::train {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

static double since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

Trainer::Trainer(const TrainOptions& o)
    : o_(o), scaler_(o.loss_scale, o.precision == DType::f16) {
  o_.validate();
  if (o_.threads > 0) omp_set_num_threads(o_.threads);
  if (o_.device != Device::cpu)
    fail("--device %s: the trainer runs on the CPU backend in this version", device_name(o_.device));
  ctx_.device = o_.device;
  train_data_ = open_batches(o_, "train", 0, 1);
  if (train_data_->vocab_size() > o_.model.vocab_size)
    fail("data '%s' uses a vocabulary of %d tokens but model.vocab_size is %d", o_.data.path.c_str(),
         train_data_->vocab_size(), o_.model.vocab_size);
  if (o_.eval_every > 0) val_data_ = open_batches(o_, "val", 0, 1);
  gpt_ = std::make_unique<model::GPT>(o_.model, store_);
  store_.finalize(arena_, o_.precision);
  gpt_->set_arena(&arena_);
  gpt_->set_ctx(ctx_);
  gpt_->set_recompute(o_.recompute);
  if (!o_.init_from.empty())
    model::import_hf(*gpt_, store_, o_.init_from);
  else
    gpt_->init_weights(o_.seed);
  adam_ = std::make_unique<AdamW>(o_.optim, store_, arena_);
  micro_.resize(size_t(o_.grad_accum));
  if (!o_.resume.empty()) load_state(o_.resume);
}

Trainer::~Trainer() = default;

StepResult Trainer::step() {
  StepResult r;
  const auto t0 = clock_type::now();
  const double wait0 = train_data_->wait_seconds();
  int valid = 0;
  for (HostBatch& b : micro_) {
    train_data_->next(b);
    valid += valid_targets(b);
  }
  r.t_data = train_data_->wait_seconds() - wait0;
  MT_CHECK(valid > 0, "a global batch without any target token");

  // Loss is the mean over the valid targets of the whole global batch; fp16 scales it up.
  const float dloss = scaler_.scale() / float(valid);
  store_.zero_grads();
  gpt_->reset_times();
  double loss_sum = 0;
  for (const HostBatch& b : micro_) {
    loss_sum += gpt_->forward_backward(view(b), dloss);
    r.tokens += b.B * b.T;
  }
  r.loss = loss_sum / valid;
  r.t_forward = gpt_->times().forward;
  r.t_backward = gpt_->times().backward;

  const auto t_opt = clock_type::now();
  const int64_t n = store_.total_numel();
  float* g = store_.grads();
  const bool finite = !scaler_.enabled() || ops::all_finite(g, n, ctx_);
  r.lr = lr_at(o_.optim, step_, o_.steps);
  if (finite) {
    const double inv_scale = 1.0 / scaler_.scale();
    r.grad_norm = std::sqrt(ops::sum_squares(g, n, ctx_)) * inv_scale;
    double coef = inv_scale;
    if (o_.optim.grad_clip > 0 && r.grad_norm > o_.optim.grad_clip) coef *= o_.optim.grad_clip / r.grad_norm;
    if (coef != 1.0) ops::scale(g, float(coef), n, ctx_);
    adam_->step(r.lr, ++updates_, ctx_);
    store_.refresh_compute();
  } else {
    r.skipped = true;
    r.grad_norm = NAN;
  }
  scaler_.update(!finite);
  step_++;
  r.t_optimizer = since(t_opt);
  r.t_total = since(t0);
  return r;
}

double Trainer::evaluate() {
  MT_CHECK(val_data_ != nullptr, "evaluate() without validation data (eval_every=0)");
  BatchSource& src = *val_data_;
  src.rewind();
  HostBatch b;
  double sum = 0;
  long valid = 0;
  for (int i = 0; i < o_.eval_batches; i++) {
    src.next(b);
    sum += gpt_->forward_loss(view(b));
    valid += valid_targets(b);
  }
  return valid ? sum / double(valid) : NAN;
}

void Trainer::save_state(const std::string& path) const {
  SafetensorsWriter w;
  for (const ParamEntry& e : store_.entries()) {
    w.add_f32("param/" + e.name, e.shape, store_.master() + e.offset);
    w.add_f32("adam_m/" + e.name, e.shape, adam_->m() + e.offset);
    w.add_f32("adam_v/" + e.name, e.shape, adam_->v() + e.offset);
  }
  nlohmann::json meta = {{"format", "minitrain-train-state"}, {"version", 1}, {"step", step_}, {"updates", updates_},
                         {"loss_scale", scaler_.scale()}, {"loss_scale_clean", scaler_.clean_steps()},
                         {"model", o_.model.to_json()}, {"data", train_data_->state()},
                         {"seed", o_.seed}};
  w.set_metadata("minitrain", meta.dump());
  w.write(path);
}

void Trainer::load_state(const std::string& path) {
  const SafetensorsFile f = SafetensorsFile::read(path);
  auto it = f.metadata().find("minitrain");
  if (it == f.metadata().end()) fail("%s is not a minitrain training state (no 'minitrain' metadata)", path.c_str());
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception&) {
    fail("%s: malformed training-state metadata", path.c_str());
  }
  if (meta.value("format", "") != "minitrain-train-state" || meta.value("version", 0) != 1)
    fail("%s: unknown training-state format or version", path.c_str());
  const model::GPTConfig saved = model::GPTConfig::from_json(meta.at("model"));
  if (!saved.same_shape(o_.model))
    fail("%s was saved from another model shape (%s) than the configured one (%s)", path.c_str(),
         saved.to_json().dump().c_str(), o_.model.to_json().dump().c_str());
  for (const ParamEntry& e : store_.entries()) {
    const struct {
      const char* prefix;
      float* dst;
    } parts[] = {{"param/", store_.master()}, {"adam_m/", adam_->m()}, {"adam_v/", adam_->v()}};
    for (const auto& p : parts) {
      const SafeTensor& t = f.get(p.prefix + e.name);
      if (t.shape != e.shape) fail("%s: tensor '%s%s' has the wrong shape", path.c_str(), p.prefix, e.name.c_str());
      std::vector<float> v = f.to_f32(t.name);
      std::copy(v.begin(), v.end(), p.dst + e.offset);
    }
  }
  step_ = meta.at("step");
  updates_ = meta.at("updates");
  scaler_.restore(meta.at("loss_scale"), meta.at("loss_scale_clean"));
  train_data_->restore(meta.at("data"));
  store_.refresh_compute();
}

void Trainer::run() {
  const fs::path out(o_.out_dir);
  const fs::path metrics_path = out / "metrics.jsonl";
  const bool resuming = !o_.resume.empty();
  if (!resuming && fs::exists(metrics_path))
    fail("out_dir '%s' already holds a run (metrics.jsonl); choose another --out or resume=<state file>",
         o_.out_dir.c_str());
  fs::create_directories(out);
  {
    std::ofstream cfg(out / "config.json");
    cfg << o_.to_json().dump(2) << "\n";
  }
  JsonlWriter log(metrics_path.string(), resuming);
  const Peak peak = o_.peak_flops > 0 ? Peak{o_.peak_flops, "user-given peak"}
                                      : calibrate_cpu_peak(o_.threads > 0 ? o_.threads : omp_get_max_threads());
  const double flops_tok = o_.model.flops_per_token(o_.seq_len);
  const double hw_flops_tok = hardware_flops_per_token(o_.model, o_.seq_len, o_.recompute);
  std::fprintf(stderr,
               "minitrain: %s (%.2fM params), B=%d T=%d accum=%d, %s, recompute=%s, %d steps -> %s\n"
               "minitrain: peak for MFU: %.1f GFLOP/s (%s)\n",
               o_.model_preset.c_str(), double(o_.model.num_params()) / 1e6, o_.batch_size, o_.seq_len,
               o_.grad_accum, dtype_name(o_.precision), model::recompute_name(o_.recompute), o_.steps,
               o_.out_dir.c_str(), peak.flops / 1e9, peak.label.c_str());
  log.write({{"event", "start"}, {"config", o_.to_json()}, {"params", o_.model.num_params()},
             {"flops_per_token", flops_tok}, {"peak_flops", peak.flops}, {"peak_label", peak.label},
             {"resumed_at", step_}});

  const auto t_run = clock_type::now();
  const int first = step_;
  while (step_ < o_.steps) {
    arena_.reset_peaks();
    const StepResult r = step();
    const double tok_s = r.tokens / r.t_total;
    const double mfu = tok_s * flops_tok / peak.flops, hfu = tok_s * hw_flops_tok / peak.flops;
    nlohmann::json j = {{"step", step_}, {"loss", r.loss}, {"lr", r.lr}, {"tokens_per_s", tok_s},
                        {"mfu", mfu}, {"hfu", hfu}, {"skipped", r.skipped},
                        {"time", {{"data", r.t_data}, {"forward", r.t_forward}, {"backward", r.t_backward},
                                  {"optimizer", r.t_optimizer}, {"total", r.t_total}}},
                        {"memory", memory_json(arena_.stats())}};
    j["grad_norm"] = std::isfinite(r.grad_norm) ? nlohmann::json(r.grad_norm) : nlohmann::json();
    if (scaler_.enabled()) j["loss_scale"] = scaler_.scale();
    if (o_.eval_every > 0 && (step_ % o_.eval_every == 0 || step_ == o_.steps)) j["val_loss"] = evaluate();
    log.write(j);
    if (step_ % o_.log_every == 0 || step_ == o_.steps) {
      const double elapsed = since(t_run);
      const double eta = elapsed / (step_ - first) * (o_.steps - step_);
      std::fprintf(stderr, "step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | MFU %.1f%% | ETA %s%s%s\n",
                   step_, o_.steps, r.loss, r.lr, r.grad_norm, tok_s, 100 * mfu, format_duration(eta).c_str(),
                   r.skipped ? " | skipped (fp16 overflow)" : "",
                   j.contains("val_loss") ? strfmt(" | val %.4f", j["val_loss"].get<double>()).c_str() : "");
    }
    if (o_.save_every > 0 && step_ % o_.save_every == 0 && step_ != o_.steps)
      save_state((out / "state.safetensors").string());
  }
  save_state((out / "state.safetensors").string());
  model::export_hf(*gpt_, store_, (out / "model.safetensors").string());
  log.write({{"event", "end"}, {"step", step_}, {"seconds", since(t_run)}});
  std::fprintf(stderr, "minitrain: done. logs %s, state %s, weights %s\n", metrics_path.c_str(),
               (out / "state.safetensors").c_str(), (out / "model.safetensors").c_str());
}

}  // namespace mt::train
