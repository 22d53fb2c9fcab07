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
  records_.push_back(Record{open_op_, open_flops_, open_bytes_, open_mark_, mark()});
  open_op_ = nullptr;
}

std::vector<OpTotal> OpTimer::totals() {
  std::vector<OpTotal> out;
  std::map<std::string, size_t> index;
  for (const Record& r : records_) {
    auto [it, fresh] = index.emplace(r.op, out.size());
    if (fresh) out.push_back(OpTotal{r.op});
    OpTotal& t = out[it->second];
    t.calls++;
    t.seconds += seconds_between(r.begin, r.end);
    t.flops += r.flops;
    t.bytes += r.bytes;
  }
  return out;
}

void OpTimer::reset() {
  MT_CHECK(open_op_ == nullptr, "op timer: reset() inside %s", open_op_);
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
