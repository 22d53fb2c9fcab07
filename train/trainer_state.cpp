// Checkpoint save and load for the trainer: the shards this rank owns become checkpoint pieces (flat
// ranges of global tensors), and loading asks the checkpoint for this rank's new shard, whatever
// layout wrote it.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "runtime/check.h"
#include "model/hf_io.h"
#include "runtime/safetensors.h"
#include "train/trainer.h"

namespace mt::train {

namespace {
constexpr const char* kParts[] = {"param/", "adam_m/", "adam_v/"};

// Calls f(entry, local_begin, local_end, shard_offset) for every part of a parameter entry inside the
// shard's segments: a ZeRO shard is a flat range [local_begin, local_end) of the entry's local
// tensor (a box of the global one), stored from shard_offset in the shard.
template <class F>
void for_each_shard_part(const ParamStore& store, const std::vector<parallel::Segment>& segments, F f) {
  int64_t shard_pos = 0;
  for (const parallel::Segment& seg : segments) {
    for (const ParamEntry& e : store.entries()) {
      const int64_t lo = std::max(seg.begin, e.offset), hi = std::min(seg.end, e.offset + e.numel);
      if (hi > lo) f(e, lo - e.offset, hi - e.offset, shard_pos + (lo - seg.begin));
    }
    shard_pos += seg.size();
  }
}

// The same, as runs [global_begin, global_end) of the global tensors' flat index.
template <class F>
void for_each_piece(const ParamStore& store, const std::vector<parallel::Segment>& segments, F f) {
  for_each_shard_part(store, segments, [&](const ParamEntry& e, int64_t lb, int64_t le, int64_t at) {
    for_each_global_run(e, lb, le, [&](int64_t gb, int64_t ge, int64_t local) { f(e, gb, ge, at + (local - lb)); });
  });
}

// Every parameter of the whole model (names and global shapes, in its entry order), whichever
// pipeline stages this rank holds: a registration without storage.
std::vector<ParamEntry> whole_model_entries(const model::GPTConfig& cfg) {
  ParamStore s;
  model::GPT g(cfg, s);
  return s.entries();
}

// A box of the global tensor's own shape that is more than one run (a column split) is stored as one
// box piece; anything else (whole tensors, row splits, c_attn's reshaped heads: a few runs) as runs.
bool stored_as_box(const ParamEntry& e) { return e.box.space == e.global_shape && e.box.run_length() < e.numel; }
}  // namespace

checkpoint::SaveRequest Trainer::checkpoint_request() {
  checkpoint::SaveRequest req;
  req.step = step_;
  // The table names every tensor of the model, also those other pipeline stages hold.
  for (const ParamEntry& e : whole_model_entries(o_.model))
    for (const char* part : kParts) req.tensors.push_back({part + e.name, e.global_shape, DType::f32});
  // ZeRO-0 replicates the whole state on every dp rank, and a replicated entry is the same on every
  // tp rank (and the tied wte on the first and last pp rank): the first replica writes it.
  // Experts held apart are replicas over their expert-data group: its first rank writes them.
  const int pp_rank = mesh_->coord(parallel::MeshDim::pp);
  auto add_pieces = [&](const ParamStore& store, const parallel::DataParallel& dp, const AdamW& adam) {
    const float* bufs[] = {dp.master_shard(), adam.m(), adam.v()};
    for_each_shard_part(store, dp.segments(), [&](const ParamEntry& e, int64_t lb, int64_t le, int64_t at) {
      if ((e.replicated & kAxisTp) && tp_.rank() != 0) return;
      if ((e.replicated & kAxisPp) && pp_rank != 0) return;
      if (stored_as_box(e)) {
        for (int k = 0; k < 3; k++)
          req.pieces.push_back({kParts[k] + e.name, lb, le, bufs[k] + at, e.box.offset, e.box.extent});
        return;
      }
      for_each_global_run(e, lb, le, [&](int64_t gb, int64_t ge, int64_t local) {
        for (int k = 0; k < 3; k++) req.pieces.push_back({kParts[k] + e.name, gb, ge, bufs[k] + at + (local - lb)});
      });
    });
  };
  if (o_.parallel.zero > 0 || replicas().rank() == 0) add_pieces(store_, *dp_, *adam_);
  if (expert_dp_ && (o_.parallel.zero > 0 || mesh_->expert_data_comm().rank() == 0))
    add_pieces(expert_store_, *expert_dp_, *expert_adam_);
  req.global_meta = {{"format", "minitrain-train-state"}, {"version", 2}, {"step", step_}, {"updates", updates_},
                     {"loss_scale", scaler_.scale()}, {"loss_scale_clean", scaler_.clean_steps()},
                     {"precision", dtype_name(o_.precision)},
                     {"global_batch", mesh_->dp() * o_.batch_size * o_.grad_accum},
                     {"model", o_.model.to_json()}, {"data", train_data_->state()}, {"seed", o_.seed},
                     {"run_id", o_.run_id}, {"config", o_.to_json()},
                     {"layout", {{"dp", mesh_->dp()}, {"tp", mesh_->tp()}, {"pp", mesh_->pp()}, {"cp", mesh_->cp()}, {"ep", mesh_->ep()}, {"sp", o_.sequence_parallel()},
                                 {"zero", o_.parallel.zero}}}};
  if (o_.model.moe.enabled()) req.global_meta["moe_bias"] = moe_bias_json();
  return req;
}

void Trainer::save_checkpoint() {
  check_state_finite();
  if (!ckpt_) ckpt_ = std::make_unique<checkpoint::Checkpointer>(ckpt_opts_, world_);
  ckpt_->save(checkpoint_request());
}

void Trainer::wait_checkpoint() {
  if (ckpt_) ckpt_->wait();
}

void Trainer::save_state(const std::string& root) {
  checkpoint::Options o = ckpt_opts_;
  o.dir = root;
  o.async = false;
  o.keep = 0;
  o.fault_phase.clear();
  check_state_finite();
  checkpoint::Checkpointer c(o, world_);
  c.save(checkpoint_request());
  c.wait();
}

std::vector<std::vector<float>> Trainer::global_master() {
  return global_tensors(dp_->master_shard(), expert_dp_ ? expert_dp_->master_shard() : nullptr);
}
std::vector<std::vector<float>> Trainer::global_grads() {
  return global_tensors(dp_->grad_shard(), expert_dp_ ? expert_dp_->grad_shard() : nullptr);
}

namespace {
// Every entry of `store` whole (its global shape), gathered over its data parallelism and over tp.
std::vector<std::vector<float>> whole_tensors(const ParamStore& store, parallel::DataParallel& dp, const float* shard,
                                              parallel::Comm* tp) {
  std::vector<float> local(static_cast<size_t>(store.total_numel()));  // this rank's boxes, whole over dp
  dp.gather_full(shard, local.data());
  const int P = tp ? tp->size() : 1;
  std::vector<std::vector<float>> out;
  for (const ParamEntry& e : store.entries()) {
    int64_t numel = 1;
    for (int64_t d : e.global_shape) numel *= d;
    out.emplace_back(size_t(numel));
    // Every tp rank's box (its offsets, then its values; the boxes of one entry have equal sizes).
    const size_t nd = e.box.offset.size();
    std::vector<int32_t> offsets(nd * size_t(P));
    std::vector<float> values(size_t(e.numel) * size_t(P));
    std::vector<int32_t> mine(e.box.offset.begin(), e.box.offset.end());
    if (tp) {
      tp->all_gather(mine.data(), offsets.data(), nd, DType::i32);
      tp->all_gather(local.data() + e.offset, values.data(), size_t(e.numel), DType::f32);
    } else {
      offsets = mine;
      std::copy(local.begin() + e.offset, local.begin() + e.offset + e.numel, values.begin());
    }
    for (int r = 0; r < P; r++) {
      ParamEntry re = e;
      for (size_t d = 0; d < nd; d++) re.box.offset[d] = offsets[size_t(r) * nd + d];
      const float* v = values.data() + int64_t(r) * e.numel;
      for_each_global_run(re, 0, e.numel, [&](int64_t gb, int64_t ge, int64_t local_pos) {
        std::copy(v + local_pos, v + local_pos + (ge - gb), out.back().begin() + gb);
      });
    }
  }
  return out;
}

// The lowest rank of `group` with have = 1 (group.size() when none).
int first_holder(parallel::Comm& group, int32_t have) {
  std::vector<int32_t> haves(size_t(group.size()));
  group.all_gather(&have, haves.data(), 1, DType::i32);
  return int(std::find(haves.begin(), haves.end(), 1) - haves.begin());
}
}  // namespace

std::vector<std::vector<float>> Trainer::global_tensors(const float* shard, const float* expert_shard) {
  parallel::Comm* tp = tp_.active() ? &tp_.comm() : nullptr;
  std::vector<std::vector<float>> out = whole_tensors(store_, *dp_, shard, tp), xout;
  if (expert_dp_) xout = whole_tensors(expert_store_, *expert_dp_, expert_shard, tp);
  const bool apart = experts_held_apart();
  if (mesh_->pp() == 1 && !apart) return out;
  // Pipeline stages hold different entries, and so do the ranks of an ep group (their experts): each
  // tensor of the whole model, in its entry order, from the ep rank holding it (a dense one: every ep
  // rank), then from the lowest pp rank that holds it.
  std::vector<std::vector<float>> all;
  for (const ParamEntry& e : whole_model_entries(o_.model)) {
    const ParamEntry* mine = store_.find(e.name);
    const ParamEntry* xmine = expert_dp_ ? expert_store_.find(e.name) : nullptr;
    std::vector<float> t = mine    ? std::move(out[size_t(mine - store_.entries().data())])
                           : xmine ? std::move(xout[size_t(xmine - expert_store_.entries().data())])
                                   : std::vector<float>(size_t(e.numel));
    int32_t have = mine || xmine;
    if (apart && !mine) {  // the same on every rank of the ep group: it holds the same dense entries
      const int owner = first_holder(mesh_->ep_comm(), have);
      if (owner < mesh_->ep()) {
        mesh_->ep_comm().broadcast(t.data(), t.size(), DType::f32, owner);
        have = 1;
      }
    }
    if (mesh_->pp() > 1) {
      const int owner = first_holder(mesh_->pp_comm(), have);
      MT_CHECK(owner < mesh_->pp(), "global_tensors: no pipeline stage holds '%s'", e.name.c_str());
      mesh_->pp_comm().broadcast(t.data(), t.size(), DType::f32, owner);
    }
    all.push_back(std::move(t));
  }
  return all;
}

void Trainer::load_state(const std::string& path) {
  namespace fs = std::filesystem;
  std::string ckpt = path;
  if (!fs::exists(fs::path(path) / "manifest.json")) {
    const auto found = checkpoint::find_latest_valid(path, world_, ckpt_opts_.log);
    if (!found) fail("resume: no valid checkpoint in '%s'", path.c_str());
    ckpt = found->path;
  }
  load_checkpoint(ckpt);
}

void Trainer::load_checkpoint(const std::string& path) {
  const checkpoint::Reader r(path);
  const nlohmann::json& meta = r.global_meta();
  if (meta.value("format", "") != "minitrain-train-state" || meta.value("version", 0) != 2)
    fail("%s: not a minitrain training checkpoint of a known version", path.c_str());
  const model::GPTConfig saved = model::GPTConfig::from_json(meta.at("model"));
  if (!saved.same_shape(o_.model))
    fail("%s was saved from another model shape (%s) than the configured one (%s)", path.c_str(),
         saved.to_json().dump().c_str(), o_.model.to_json().dump().c_str());
  std::vector<checkpoint::TensorInfo> expected;
  for (const ParamStore* s : {&store_, &expert_store_})
    for (const ParamEntry& e : s->entries())
      for (const char* part : kParts) expected.push_back({part + e.name, e.global_shape, DType::f32});
  r.check_tensors(expected);
  // Each store's shard (the experts held apart: theirs) by global slice, whatever layout wrote it.
  auto load_shard = [&](const ParamStore& store, const parallel::DataParallel& dp, const AdamW& adam) {
    float* bufs[] = {dp.master_shard(), adam.m(), adam.v()};
    const size_t n = size_t(dp.shard_numel());
    // Device state is read into (zeroed) host vectors and uploaded whole; host state is read in place.
    const MemOps& mem = arena_.mem();
    const bool on_host = mem.device == Device::cpu;
    std::vector<std::vector<float>> staging(on_host ? 0 : 3, std::vector<float>(on_host ? 0 : n));
    float* dst[3];
    for (int k = 0; k < 3; k++) {
      dst[k] = on_host ? bufs[k] : staging[size_t(k)].data();
      if (on_host) std::memset(dst[k], 0, n * sizeof(float));  // padding stays zero
    }
    for_each_piece(store, dp.segments(), [&](const ParamEntry& e, int64_t fb, int64_t fe, int64_t at) {
      for (int k = 0; k < 3; k++) r.read(kParts[k] + e.name, fb, fe, dst[k] + at);
    });
    if (!on_host)
      for (int k = 0; k < 3; k++) mem.upload(bufs[k], dst[k], n * sizeof(float));
  };
  load_shard(store_, *dp_, *adam_);
  if (expert_dp_) load_shard(expert_store_, *expert_dp_, *expert_adam_);
  step_ = meta.at("step");
  updates_ = meta.at("updates");
  restore_loss_scale(meta, path);
  report_changes(meta, path);
  train_data_->restore(meta.at("data"));
  restore_moe_bias(meta, path);
  dp_->publish_params();
  if (expert_dp_) expert_dp_->publish_params();
  if (world_.rank() == 0) std::fprintf(stderr, "minitrain: resumed from %s (step %d)\n", path.c_str(), step_);
}

}  // namespace mt::train

namespace mt::train {

void export_checkpoint(const std::string& ckpt_path, const std::string& out_path, bool all) {
  const checkpoint::Reader r(ckpt_path);
  const nlohmann::json& meta = r.global_meta();
  if (meta.value("format", "") != "minitrain-train-state")
    fail("%s: not a minitrain training checkpoint", ckpt_path.c_str());
  const model::GPTConfig cfg = model::GPTConfig::from_json(meta.at("model"));
  Arena arena;
  ParamStore store;
  model::GPT gpt(cfg, store);
  store.finalize(arena, DType::f32);
  for (const ParamEntry& e : store.entries()) r.read("param/" + e.name, 0, e.numel, store.master() + e.offset);
  model::export_hf(gpt, store, store.master(), out_path);
  if (!all) return;
  // Append the moments: rewrite the file with them added (sizes are small for the tests that use it).
  SafetensorsFile f = SafetensorsFile::read(out_path);
  SafetensorsWriter w;
  for (const SafeTensor& t : f.tensors()) w.add(t.name, t.dtype, t.shape, t.data.data());
  for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
  std::vector<float> buf;
  for (const ParamEntry& e : store.entries())
    for (const char* part : {"adam_m/", "adam_v/"}) {
      buf.resize(size_t(e.numel));
      r.read(part + e.name, 0, e.numel, buf.data());
      w.add_f32(part + e.name, e.shape, buf.data());
    }
  w.write(out_path);
}

}  // namespace mt::train
