#include "kernels/op_timer.h"

#include <chrono>
#include <map>

#include "runtime/check.h"

namespace mt::ops {

void OpTimer::begin(const char* op, double flops, double bytes) {
  MT_CHECK(open_op_ == nullptr, "op timer: %s began inside %s (ops do not nest)", op, open_op_);
  open_op_ = op;
  open_flops_ = flops;
  open_bytes_ = bytes;
  open_mark_ = mark();
}

void OpTimer::end() {
  MT_CHECK(open_op_ != nullptr, "op timer: end() without begin()");
  MT_CHECK(regions_in_op_ == 0, "op timer: %s ended with a region still open inside it", open_op_);
  records_.push_back(Record{open_op_, open_flops_, open_bytes_, open_mark_, mark(), innermost(), false});
  open_op_ = nullptr;
}

void OpTimer::begin_region(const char* name) {
  if (open_op_) {
    regions_in_op_++;
    return;
  }
  records_.push_back(Record{name, 0, 0, mark(), 0, innermost(), true});
  open_regions_.push_back(long(records_.size()) - 1);
}

void OpTimer::end_region() {
  if (regions_in_op_ > 0) {
    regions_in_op_--;
    return;
  }
  MT_CHECK(open_op_ == nullptr, "op timer: a region ended inside %s, which it did not begin in", open_op_);
  MT_CHECK(!open_regions_.empty(), "op timer: end_region() without begin_region()");
  records_[size_t(open_regions_.back())].end = mark();
  open_regions_.pop_back();
}

std::vector<OpTotal> OpTimer::totals() {
  MT_CHECK(open_regions_.empty(), "op timer: totals() inside region %s", records_[size_t(innermost())].op);
  // Each record's whole time, then a region's own: less what its direct children took.
  std::vector<double> own(records_.size());
  for (size_t i = 0; i < records_.size(); i++) own[i] = seconds_between(records_[i].begin, records_[i].end);
  std::vector<double> whole = own;
  for (size_t i = 0; i < records_.size(); i++)
    if (records_[i].parent >= 0) own[size_t(records_[i].parent)] -= whole[i];
  std::vector<OpTotal> out;
  std::map<std::pair<std::string, bool>, size_t> index;
  for (size_t i = 0; i < records_.size(); i++) {
    const Record& r = records_[i];
    auto [it, fresh] = index.emplace(std::make_pair(std::string(r.op), r.region), out.size());
    if (fresh) out.push_back(OpTotal{r.op});
    OpTotal& t = out[it->second];
    t.calls++;
    t.seconds += own[i];
    t.flops += r.flops;
    t.bytes += r.bytes;
    t.region = r.region;
  }
  return out;
}

void OpTimer::reset() {
  MT_CHECK(open_op_ == nullptr, "op timer: reset() inside %s", open_op_);
  MT_CHECK(open_regions_.empty(), "op timer: reset() inside region %s", records_[size_t(innermost())].op);
  records_.clear();
  clear_marks();
}

namespace {

class HostTimer final : public OpTimer {
  using clock = std::chrono::steady_clock;
  std::vector<clock::time_point> marks_;

 protected:
  size_t mark() override {
    marks_.push_back(clock::now());
    return marks_.size() - 1;
  }
  double seconds_between(size_t a, size_t b) override {
    return std::chrono::duration<double>(marks_[b] - marks_[a]).count();
  }
  void clear_marks() override { marks_.clear(); }
};

}  // namespace

std::unique_ptr<OpTimer> make_host_timer() { return std::make_unique<HostTimer>(); }

}  // namespace mt::ops
