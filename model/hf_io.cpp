#include "model/hf_io.h"

#include <vector>

#include "runtime/check.h"
#include "runtime/safetensors.h"

namespace mt::model {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

// dst (cols, rows) = transpose of src (rows, cols)
void transpose(float* dst, const float* src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

}  // namespace

bool hf_is_conv1d(const std::string& name) {
  auto ends = [&](const char* s) {
    std::string t(s);
    return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
  };
  return ends("attn.c_attn.weight") || ends("attn.c_proj.weight") || ends("mlp.c_fc.weight") ||
         ends("mlp.c_proj.weight");
}

void import_hf(const GPT& model, ParamStore& store, const std::string& path) {
  const SafetensorsFile f = SafetensorsFile::read(path);
  const GPTConfig& cfg = model.config();
  MT_CHECK(store.master() != nullptr, "import_hf needs the full master weights");
  // Built on the host (in place when the master is host memory), then uploaded in one copy.
  const bool on_host = store.mem().device == Device::cpu;
  std::vector<float> staging(on_host ? 0 : size_t(store.total_numel()));
  float* master = on_host ? store.master() : staging.data();
  for (int i = 0; i < int(store.entries().size()); i++) {
    const ParamEntry& e = store.entry(i);
    const SafeTensor* t = f.find(e.name);
    if (!t && e.name.rfind("transformer.", 0) == 0) t = f.find(e.name.substr(12));
    if (!t) fail("%s: tensor '%s' is missing (is this a GPT-2 file of the configured shape?)", path.c_str(),
                 e.name.c_str());
    std::vector<int64_t> want = e.global_shape;
    if (hf_is_conv1d(e.name)) std::swap(want[0], want[1]);
    if (e.name == "transformer.wte.weight") want[0] = cfg.vocab_size;  // any store: the experts' too
    if (t->shape != want)
      fail("%s: tensor '%s' has shape %s but the model expects %s (model: vocab_size=%d block_size=%d n_layer=%d "
           "n_embd=%d)",
           path.c_str(), e.name.c_str(), shape_str(t->shape).c_str(), shape_str(want).c_str(), cfg.vocab_size,
           cfg.block_size, cfg.n_layer, cfg.n_embd);
    std::vector<float> v = f.to_f32(t->name);
    // The whole tensor in the model's orientation (padded vocabulary rows zero), then this rank's box.
    int64_t numel = 1;
    for (int64_t d : e.global_shape) numel *= d;
    std::vector<float> whole(size_t(numel), 0.f);
    if (hf_is_conv1d(e.name))
      transpose(whole.data(), v.data(), want[0], want[1]);
    else
      std::copy(v.begin(), v.end(), whole.begin());
    float* dst = master + e.offset;
    for_each_global_run(e, 0, e.numel, [&](int64_t gb, int64_t ge, int64_t local) {
      std::copy(whole.begin() + gb, whole.begin() + ge, dst + local);
    });
  }
  // A file with more layers than the model would silently lose them: refuse it.
  const std::string extra = "transformer.h." + std::to_string(cfg.n_layer) + ".ln_1.weight";
  if (f.find(extra) || f.find(extra.substr(12)))
    fail("%s: the file has more than model.n_layer=%d layers", path.c_str(), cfg.n_layer);
  if (!on_host) store.mem().upload(store.master(), master, staging.size() * sizeof(float));
  if (store.full_compute()) store.refresh_compute();  // else the sharding engine derives compute
}

void export_hf(const GPT& model, const ParamStore& store, const float* master, const std::string& path) {
  SafetensorsWriter w;
  const GPTConfig& cfg = model.config();
  std::vector<float> tmp;
  for (int i = 0; i < int(store.entries().size()); i++) {
    const ParamEntry& e = store.entry(i);
    MT_CHECK(e.box.whole(), "export_hf: '%s' is split over ranks; export a checkpoint instead", e.name.c_str());
    std::vector<int64_t> shape = e.shape;
    const float* src = master + e.offset;
    if (hf_is_conv1d(e.name)) {
      tmp.resize(size_t(e.numel));
      transpose(tmp.data(), src, shape[0], shape[1]);
      std::swap(shape[0], shape[1]);
      src = tmp.data();
    } else if (i == model.wte()) {
      shape[0] = cfg.vocab_size;  // drop the padded rows
    }
    w.add_f32(e.name, shape, src);
  }
  w.set_metadata("format", "pt");
  w.set_metadata("minitrain_config", cfg.to_json().dump());
  w.write(path);
}

}  // namespace mt::model
