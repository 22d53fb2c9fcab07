#include "data/loader.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "runtime/check.h"

namespace mt::data {

namespace fs = std::filesystem;

namespace {
constexpr int kStateVersion = 1;
using Clock = std::chrono::steady_clock;
}  // namespace

std::vector<DataSource> parse_mixture(const std::string& spec, const char* flag) {
  std::vector<DataSource> out;
  size_t begin = 0;
  while (begin <= spec.size()) {
    size_t end = spec.find(',', begin);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(begin, end - begin);
    if (item.empty()) fail("%s: empty entry in '%s'", flag, spec.c_str());
    DataSource s;
    size_t colon = item.rfind(':');
    s.path = item;
    if (colon != std::string::npos) {
      std::string w = item.substr(colon + 1);
      char* stop = nullptr;
      double v = std::strtod(w.c_str(), &stop);
      if (w.empty() || *stop != '\0' || !(v > 0) || !std::isfinite(v))
        fail("%s: weight '%s' of '%s' must be a positive number", flag, w.c_str(), item.c_str());
      s.path = item.substr(0, colon);
      s.weight = v;
      if (s.path.empty()) fail("%s: entry '%s' names no dataset", flag, item.c_str());
    }
    // Listed twice, the dataset would be read twice as often as its weight says, and its two streams
    // would repeat each other's windows: one entry, with the summed weight, says what is meant.
    for (const DataSource& o : out) {
      std::error_code ec;
      if (o.path == s.path || fs::equivalent(o.path, s.path, ec))
        fail("%s: '%s' and '%s' name the same dataset; list it once (with the summed weight)", flag,
             o.path.c_str(), s.path.c_str());
    }
    out.push_back(s);
    begin = end + 1;
  }
  return out;
}

uint64_t Loader::State::position() const {
  uint64_t p = 0;
  for (uint64_t c : consumed) p += c;
  return p;
}

Loader::Loader(LoaderConfig cfg) : cfg_(std::move(cfg)) {
  if (cfg_.sources.empty()) fail("data: no dataset given");
  if (cfg_.B <= 0) fail("data: batch rows per rank must be positive (got %d)", cfg_.B);
  if (cfg_.T <= 0) fail("data: sequence length must be positive (got %d)", cfg_.T);
  if (cfg_.dp_size <= 0 || cfg_.dp_rank < 0 || cfg_.dp_rank >= cfg_.dp_size)
    fail("data: dp rank %d is outside [0, dp size %d)", cfg_.dp_rank, cfg_.dp_size);
  if (cfg_.prefetch < 0) fail("data: prefetch depth must be >= 0 (got %d)", cfg_.prefetch);
  std::vector<uint64_t> windows;
  std::vector<double> weights;
  for (const DataSource& s : cfg_.sources) {
    datasets_.push_back(std::make_unique<Dataset>(s.path, cfg_.split, cfg_.verify));
    const Dataset& d = *datasets_.back();
    const Dataset& first = *datasets_.front();
    if (d.vocab_size() != first.vocab_size() || d.eot_token() != first.eot_token())
      fail("%s: vocab %u / end-of-text %u differs from %s (vocab %u / end-of-text %u): mixed datasets must "
           "share a tokenizer", s.path.c_str(), d.vocab_size(), d.eot_token(), first.source().c_str(),
           first.vocab_size(), first.eot_token());
    const std::string fp = tokenizer_fingerprint();  // the first one recorded (this dataset's, if none before)
    if (!fp.empty() && !d.tokenizer_fingerprint().empty() && d.tokenizer_fingerprint() != fp)
      fail("%s (tokenizer fingerprint %s) and %s (tokenizer fingerprint %s) were tokenized differently: mixed "
           "datasets must share a tokenizer", s.path.c_str(), d.tokenizer_fingerprint().c_str(),
           tokenizer_source().c_str(), fp.c_str());
    uint64_t w = d.num_windows(cfg_.T);
    if (w == 0)
      fail("%s: the %s split has %llu tokens, fewer than sequence length + 1 = %d", s.path.c_str(),
           split_name(cfg_.split), (unsigned long long)d.num_tokens(), cfg_.T + 1);
    windows.push_back(w);
    weights.push_back(s.weight);
  }
  sampler_ = std::make_unique<Sampler>(windows, weights, cfg_.mode, cfg_.seed);
  state_.consumed.assign(datasets_.size(), 0);
  start_worker();
}

Loader::~Loader() { stop_worker(); }

Loader::State Loader::produce(const State& s, Batch& out) const {
  const int B = cfg_.B, T = cfg_.T;
  out.resize(B, T, cfg_.doc_mask);
  State next = s;
  const uint64_t p0 = s.position();
  const uint64_t global_rows = uint64_t(cfg_.dp_size) * uint64_t(B);
  const uint64_t mine = uint64_t(cfg_.dp_rank) * uint64_t(B);
  std::vector<int32_t> window(size_t(T) + 1);
  std::vector<int> cuts;
  // Walk the whole global micro-batch so every dataset's counter advances as on every other rank;
  // only this rank's slice is read and packed.
  for (uint64_t q = 0; q < global_rows; q++) {
    uint32_t k = sampler_->dataset_at(p0 + q);
    uint64_t n = next.consumed[k]++;
    if (q < mine || q >= mine + uint64_t(B)) continue;
    int row = int(q - mine);
    SampleRef ref = sampler_->sample(k, n);
    const Dataset& d = *datasets_[k];
    uint64_t begin = ref.window * uint64_t(T);
    d.read(begin, uint64_t(T) + 1, window.data());
    cuts.clear();
    if (cfg_.doc_mask) d.doc_starts_in(begin, uint64_t(T) + 1, cuts);
    size_t o = size_t(row) * size_t(T);
    pack_row(out.inputs.data() + o, out.targets.data() + o, cfg_.doc_mask ? out.doc_ids.data() + o : nullptr,
             cfg_.doc_mask ? out.positions.data() + o : nullptr, window, cuts, T);
    out.row_dataset[size_t(row)] = k;
    out.row_epoch[size_t(row)] = ref.epoch;
    out.row_window[size_t(row)] = ref.window;
  }
  return next;
}

void Loader::start_worker() {
  if (cfg_.prefetch == 0) return;
  stop_ = false;
  error_ = nullptr;
  State from = state_;
  worker_ = std::thread([this, from]() mutable {
    try {
      for (;;) {
        {
          std::unique_lock<std::mutex> lk(mu_);
          cv_.wait(lk, [&] { return stop_ || queue_.size() < size_t(cfg_.prefetch); });
          if (stop_) return;
        }
        Item it;
        it.after = produce(from, it.batch);
        from = it.after;
        std::lock_guard<std::mutex> lk(mu_);
        queue_.push_back(std::move(it));
        cv_.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
    }
  });
}

void Loader::stop_worker() {
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  queue_.clear();
}

void Loader::next(Batch& out) {
  auto t0 = Clock::now();
  if (cfg_.prefetch == 0) {
    state_ = produce(state_, out);
  } else {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !queue_.empty() || error_; });
    if (queue_.empty()) std::rethrow_exception(error_);
    Item it = std::move(queue_.front());
    queue_.pop_front();
    cv_.notify_all();
    lk.unlock();
    std::swap(out, it.batch);
    state_ = std::move(it.after);
  }
  std::lock_guard<std::mutex> lk(mu_);
  wait_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

double Loader::wait_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return wait_s_;
}

uint64_t Loader::num_tokens() const {
  uint64_t n = 0;
  for (const auto& d : datasets_) n += d->num_tokens();
  return n;
}

uint64_t Loader::num_docs() const {
  uint64_t n = 0;
  for (const auto& d : datasets_) n += d->num_docs();
  return n;
}

uint64_t Loader::num_windows() const {
  uint64_t n = 0;
  for (size_t k = 0; k < datasets_.size(); k++) n += sampler_->num_windows(k);
  return n;
}

uint64_t Loader::position() const { return state_.position(); }
uint64_t Loader::epoch() const { return state_.consumed[0] / sampler_->num_windows(0); }

std::string Loader::tokenizer_fingerprint() const {
  for (const auto& d : datasets_)
    if (!d->tokenizer_fingerprint().empty()) return d->tokenizer_fingerprint();
  return "";
}

std::string Loader::tokenizer_source() const {
  for (const auto& d : datasets_)
    if (!d->tokenizer_fingerprint().empty()) return d->source();
  return "";
}

void Loader::check_model_vocab(int model_vocab) const {
  if (uint64_t(model_vocab) != vocab_size())
    fail("%s: the data was tokenized with a vocabulary of %u tokens but the model has vocab_size %d; "
         "re-prepare the data with the model's tokenizer or set the model's vocab_size to %u",
         datasets_[0]->source().c_str(), vocab_size(), model_vocab, vocab_size());
}

nlohmann::json Loader::state() const {
  nlohmann::json j;
  j["format"] = "minitrain-loader";
  j["version"] = kStateVersion;
  j["mode"] = sample_mode_name(cfg_.mode);
  j["seed"] = cfg_.seed;
  j["seq_len"] = cfg_.T;
  j["position"] = state_.position();
  j["datasets"] = nlohmann::json::array();
  for (size_t k = 0; k < datasets_.size(); k++) {
    uint64_t w = sampler_->num_windows(k);
    j["datasets"].push_back({{"source", datasets_[k]->source()},
                             {"weight", cfg_.sources[k].weight},
                             {"windows", w},
                             {"consumed", state_.consumed[k]},
                             {"epoch", state_.consumed[k] / w}});
  }
  return j;
}

void Loader::restore(const nlohmann::json& j) {
  State s;
  try {
    if (j.at("format").get<std::string>() != "minitrain-loader" || j.at("version").get<int>() != kStateVersion)
      fail("data state: not a version-%d loader state", kStateVersion);
    if (j.at("mode").get<std::string>() != sample_mode_name(cfg_.mode))
      fail("data state: saved in mode %s, the loader runs in mode %s", j.at("mode").get<std::string>().c_str(),
           sample_mode_name(cfg_.mode));
    if (j.at("seed").get<uint64_t>() != cfg_.seed)
      fail("data state: saved with seed %llu, the loader has seed %llu",
           (unsigned long long)j.at("seed").get<uint64_t>(), (unsigned long long)cfg_.seed);
    if (j.at("seq_len").get<int>() != cfg_.T)
      fail("data state: saved with sequence length %d, the loader has %d", j.at("seq_len").get<int>(), cfg_.T);
    const auto& ds = j.at("datasets");
    if (ds.size() != datasets_.size())
      fail("data state: saved for %zu datasets, the loader has %zu", ds.size(), datasets_.size());
    for (size_t k = 0; k < ds.size(); k++) {
      uint64_t w = ds[k].at("windows").get<uint64_t>();
      if (w != sampler_->num_windows(k))
        fail("data state: dataset %zu (%s) had %llu windows when saved, now %llu: the data changed", k,
             datasets_[k]->source().c_str(), (unsigned long long)w, (unsigned long long)sampler_->num_windows(k));
      if (datasets_.size() > 1 && ds[k].at("weight").get<double>() != cfg_.sources[k].weight)
        fail("data state: dataset %zu (%s) had mixture weight %g when saved, now %g", k,
             datasets_[k]->source().c_str(), ds[k].at("weight").get<double>(), cfg_.sources[k].weight);
      s.consumed.push_back(ds[k].at("consumed").get<uint64_t>());
    }
  } catch (const nlohmann::json::exception& e) {
    fail("data state: malformed: %s", e.what());
  }
  stop_worker();
  state_ = std::move(s);
  start_worker();
}

void Loader::rewind() {
  stop_worker();
  state_.consumed.assign(datasets_.size(), 0);
  start_worker();
}

}  // namespace mt::data
