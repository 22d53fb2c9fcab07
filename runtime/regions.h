// Named stretches of host work between ops: allocation, the data path, the loss, bookkeeping. In a
// profiling or traced run a sink turns each into a row of the op profile and a span of the trace
// (kernels/ops.h, ops::Regions), so that a step's time outside its ops is accounted for by name
// instead of as one remainder. Code below kernels/ (the arena) sees only this interface; a run
// without profile or trace has no sink, and a scope then costs a null test.
#pragma once

namespace mt {

struct RegionSink {
  virtual ~RegionSink() = default;
  // `name` is a literal (kept by pointer). Regions nest; each end closes the innermost open one.
  virtual void begin_region(const char* name) = 0;
  virtual void end_region() = 0;
};

// One region from construction to destruction; a null sink does nothing.
class RegionScope {
 public:
  RegionScope(RegionSink* sink, const char* name) : sink_(sink) {
    if (sink_) sink_->begin_region(name);
  }
  ~RegionScope() {
    try {
      if (sink_) sink_->end_region();
    } catch (...) {  // a lost timing or span, never a lost result
    }
  }
  RegionScope(const RegionScope&) = delete;
  RegionScope& operator=(const RegionScope&) = delete;

 private:
  RegionSink* sink_;
};

}  // namespace mt
