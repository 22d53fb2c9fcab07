// Training-state save and load. The state is written in the store's full layout (gathered from the
// ZeRO shards) by rank 0, and each rank takes its own shard when loading, so a state saved under one
// dp size or ZeRO stage loads under another.
#include <vector>

#include "runtime/check.h"
#include "runtime/safetensors.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::save_state(const std::string& path) {
  const size_t n = size_t(store_.total_numel());
  std::vector<float> master(n), m(n), v(n);
  dp_->gather_full(dp_->master_shard(), master.data());
  dp_->gather_full(adam_->m(), m.data());
  dp_->gather_full(adam_->v(), v.data());
  const nlohmann::json data_state = train_data_->state();
  if (world_.rank() != 0) return;
  SafetensorsWriter w;
  for (const ParamEntry& e : store_.entries()) {
    w.add_f32("param/" + e.name, e.shape, master.data() + e.offset);
    w.add_f32("adam_m/" + e.name, e.shape, m.data() + e.offset);
    w.add_f32("adam_v/" + e.name, e.shape, v.data() + e.offset);
  }
  nlohmann::json meta = {{"format", "minitrain-train-state"}, {"version", 1}, {"step", step_}, {"updates", updates_},
                         {"loss_scale", scaler_.scale()}, {"loss_scale_clean", scaler_.clean_steps()},
                         {"model", o_.model.to_json()}, {"data", data_state}, {"seed", o_.seed}};
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
  const size_t n = size_t(store_.total_numel());
  std::vector<float> full(n);
  const struct {
    const char* prefix;
    float* shard;
  } parts[] = {{"param/", dp_->master_shard()}, {"adam_m/", adam_->m()}, {"adam_v/", adam_->v()}};
  for (const auto& p : parts) {
    std::fill(full.begin(), full.end(), 0.f);
    for (const ParamEntry& e : store_.entries()) {
      const SafeTensor& t = f.get(p.prefix + e.name);
      if (t.shape != e.shape) fail("%s: tensor '%s%s' has the wrong shape", path.c_str(), p.prefix, e.name.c_str());
      const std::vector<float> v = f.to_f32(t.name);
      std::copy(v.begin(), v.end(), full.begin() + e.offset);
    }
    dp_->take_shard(full.data(), p.shard);
  }
  step_ = meta.at("step");
  updates_ = meta.at("updates");
  scaler_.restore(meta.at("loss_scale"), meta.at("loss_scale_clean"));
  train_data_->restore(meta.at("data"));
  dp_->publish_params();
}

}  // namespace mt::train
