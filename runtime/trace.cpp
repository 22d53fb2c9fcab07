// The Chrome trace writer (see trace.h).
#include "runtime/trace.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/check.h"

namespace mt {

Trace::Trace(int rank, std::string process_name, size_t max_events)
    : rank_(rank),
      process_name_(std::move(process_name)),
      max_events_(max_events),
      origin_(Clock::now()),
      origin_epoch_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch()).count()) {}

int Trace::lane(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < lanes_.size(); i++)
    if (lanes_[i] == name) return int(i);
  lanes_.push_back(name);
  return int(lanes_.size() - 1);
}

void Trace::add(std::string name, const char* category, int lane, Clock::time_point begin, Clock::time_point end,
                std::string args) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= max_events_) {
    dropped_++;
    return;
  }
  const auto ns = [](Clock::duration d) { return int64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()); };
  events_.push_back(Event{std::move(name), category, lane, ns(begin - origin_), ns(end - begin), std::move(args)});
}

size_t Trace::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

size_t Trace::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

std::string Trace::json() const {
  std::lock_guard<std::mutex> lock(mu_);
  using nlohmann::json;
  json ev = json::array();
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank_}, {"tid", 0}, {"args", {{"name", process_name_}}}});
  ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank_}, {"tid", 0}, {"args", {{"sort_index", rank_}}}});
  for (size_t i = 0; i < lanes_.size(); i++) {
    ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank_}, {"tid", int(i)}, {"args", {{"name", lanes_[i]}}}});
    ev.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", rank_}, {"tid", int(i)}, {"args", {{"sort_index", int(i)}}}});
  }
  for (const Event& e : events_) {
    json j = {{"ph", "X"},     {"name", e.name},  {"cat", e.category},        {"pid", rank_},
              {"tid", e.lane}, {"ts", double(origin_epoch_ns_ + e.begin_ns) / 1e3}, {"dur", double(e.dur_ns) / 1e3}};
    if (!e.args.empty()) j["args"] = json::parse(e.args);
    ev.push_back(std::move(j));
  }
  json doc = {{"traceEvents", std::move(ev)}, {"displayTimeUnit", "ms"}};
  doc["otherData"] = {{"rank", rank_}, {"events", events_.size()}, {"dropped_events", dropped_}};
  return doc.dump() + "\n";
}

void Trace::write(const std::string& path) const {
  const std::string text = json();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("trace: cannot write %s", tmp.c_str());
    f.write(text.data(), std::streamsize(text.size()));
    f.flush();
    if (!f) fail("trace: writing %s failed (disk full?)", tmp.c_str());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("trace: cannot rename %s to %s: %s", tmp.c_str(), path.c_str(), ec.message().c_str());
}

Trace::Span::Span(Trace* t, int lane, const char* category, std::string name)
    : t_(t && t->recording() ? t : nullptr), lane_(lane), category_(category), name_(std::move(name)) {
  if (t_) begin_ = Clock::now();
}

Trace::Span::~Span() {
  if (t_) t_->add(std::move(name_), category_, lane_, begin_, Clock::now());
}

}  // namespace mt
