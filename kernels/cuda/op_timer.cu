// The CUDA op timer (kernels/op_timer.h): a mark is an event recorded on the ops' stream; the time
// between two marks is the device's time for the work queued between them.
#include <memory>
#include <vector>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/op_timer.h"

namespace mt::cuda {
namespace {

class EventTimer final : public ops::OpTimer {
 public:
  explicit EventTimer(cudaStream_t stream) : stream_(stream) {}
  ~EventTimer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);  // errors ignored: nothing to do about them here
  }

 protected:
  size_t mark() override {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      MT_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    MT_CUDA_CHECK(cudaEventRecord(events_[used_], stream_));
    return used_++;
  }
  double seconds_between(size_t a, size_t b) override {
    MT_CUDA_CHECK(cudaEventSynchronize(events_[b]));
    float ms = 0.f;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[a], events_[b]));
    return 1e-3 * double(ms);
  }
  void clear_marks() override { used_ = 0; }  // the events are reused

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<ops::OpTimer> make_event_timer(void* stream) {
  return std::make_unique<EventTimer>(static_cast<cudaStream_t>(stream));
}

}  // namespace mt::cuda
