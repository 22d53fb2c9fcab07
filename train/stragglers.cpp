// The straggler check (train/stragglers.h) and the trainer's side of waits on peers: the wait policy
// of its communicators, the flight records a timeout leaves, the busy times gathered each step, and
// the hang and straggler faults.
#include "train/stragglers.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <thread>

#include "checkpoint/fsio.h"
#include "parallel/flight_recorder.h"
#include "runtime/check.h"
#include "train/trainer.h"

namespace mt::train {

StragglerVerdict judge_stragglers(const std::vector<double>& busy_s, double threshold) {
  StragglerVerdict v;
  if (busy_s.size() < 2) return v;
  std::vector<double> sorted = busy_s;
  std::sort(sorted.begin(), sorted.end());
  v.median_s = sorted[(sorted.size() - 1) / 2];
  v.rank = int(std::max_element(busy_s.begin(), busy_s.end()) - busy_s.begin());
  v.max_s = busy_s[size_t(v.rank)];
  v.ratio = v.median_s > 0 ? v.max_s / v.median_s : 1.0;
  v.straggler = threshold > 0 && v.ratio > threshold && v.max_s - v.median_s >= kStragglerMinGap;
  return v;
}

void StragglerTally::add(const std::vector<double>& busy_s, const StragglerVerdict& v) {
  if (busy_s.size() < 2) return;
  ratio_sum_.resize(busy_s.size(), 0.0);
  named_.resize(busy_s.size(), 0);
  for (size_t r = 0; r < busy_s.size(); r++) ratio_sum_[r] += v.median_s > 0 ? busy_s[r] / v.median_s : 1.0;
  if (v.straggler) named_[size_t(v.rank)]++;
  steps_++;
}

std::string StragglerTally::slowest(size_t n) const {
  if (steps_ == 0) return "";
  std::vector<size_t> order(ratio_sum_.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ratio_sum_[a] > ratio_sum_[b]; });
  std::string s;
  for (size_t i = 0; i < std::min(n, order.size()); i++) {
    const size_t r = order[i];
    s += strfmt("%srank %zu x%.2f", i ? ", " : "", r, ratio_sum_[r] / steps_);
    if (named_[r]) s += strfmt(" (named in %d of %d steps)", named_[r], steps_);
  }
  return s;
}

namespace fs = std::filesystem;

void Trainer::install_wait_policy() {
  parallel::WaitPolicy p;
  p.timeout_s = o_.dist.timeout;
  p.on_timeout = [this] { return write_flight_records(); };
  world_.set_wait_policy(p);  // the mesh's communicators are split from the world: they inherit it
}

std::string Trainer::write_flight_records() const {
  std::string text = parallel::flight_records_jsonl(world_);
  if (mesh_ && mesh_->has_comms())
    for (const parallel::Comm* c : mesh_->comms()) text += parallel::flight_records_jsonl(*c);
  const fs::path path = fs::path(o_.out_dir) / strfmt("flight_recorder.rank%d.jsonl", world_.rank());
  fs::create_directories(o_.out_dir);
  checkpoint::io::write_file_atomically(path.string(), text);
  return "last communication records in " + path.string();
}

double Trainer::blocked_seconds() const {
  double s = world_.blocked_seconds();
  for (const parallel::Comm* c : mesh_->comms()) s += c->blocked_seconds();
  return s;
}

std::vector<double> Trainer::gather_busy(double busy_s) {
  float mine = float(busy_s);
  std::vector<float> all(size_t(world_.size()));
  world_.all_gather(&mine, all.data(), 1, DType::f32);
  return std::vector<double>(all.begin(), all.end());
}

void Trainer::delay_faults() {
  const checkpoint::Options& f = ckpt_opts_;
  if (f.fault_rank != world_.rank()) return;
  const int step = step_ + 1;
  if (f.fault_phase == "hang" && step == f.fault_step) {
    std::fprintf(stderr, "[fault] rank %d: SIGSTOP at step %d\n", world_.rank(), step);
    std::fflush(stderr);
    std::raise(SIGSTOP);  // stopped until the launcher ends the job (SIGKILL reaches a stopped process)
  }
  if (f.fault_phase == "straggler" && step >= f.fault_step) std::this_thread::sleep_for(kStragglerDelay);
}

}  // namespace mt::train
