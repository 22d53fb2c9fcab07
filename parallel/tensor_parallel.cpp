#include "parallel/tensor_parallel.h"

#include "runtime/check.h"

namespace mt::parallel {

TensorParallel::TensorParallel(Comm& tp, bool sp, Comm* data)
    : comm_(&tp), data_(data ? data : &tp), size_(tp.size()), rank_(tp.rank()), sp_(sp) {
  MT_CHECK(data_->size() == size_ && data_->rank() == rank_, "the tensor-parallel data communicator (%d of %d) "
           "is not over the same ranks as its host one (%d of %d)", data_->rank(), data_->size(), rank_, size_);
}

Comm& TensorParallel::comm() const {
  MT_CHECK(comm_ != nullptr, "tensor parallelism without a communicator");
  return *comm_;
}

Comm& TensorParallel::data_comm() const {
  MT_CHECK(data_ != nullptr, "tensor parallelism without a communicator");
  return *data_;
}

ParamBox TensorParallel::split(std::vector<int64_t> space, int dim) const {
  const size_t d = size_t(dim);
  MT_CHECK(d < space.size() && space[d] % size_ == 0, "cannot split dimension %d (%lld) into %d parts", dim,
           d < space.size() ? (long long)space[d] : -1LL, size_);
  ParamBox b{space, std::vector<int64_t>(space.size(), 0), space};
  b.extent[d] = space[d] / size_;
  b.offset[d] = rank_ * b.extent[d];
  return b;
}

TensorParallelGrads::TensorParallelGrads(ParamStore& store, const TensorParallel& tp, DataParallel& dp)
    : store_(store), tp_(tp), dp_(dp), partial_(size_t(store.num_units())) {
  // Offsets relative to the unit's start (its gradient buffer may move between steps under ZeRO-2/3).
  for (const ParamEntry& e : store.entries()) {
    if (!(e.partial_grad & kAxisTp)) continue;
    auto& ranges = partial_[size_t(e.unit)];
    const int64_t b = e.offset - store.units()[size_t(e.unit)].begin;
    if (!ranges.empty() && ranges.back().second == b)
      ranges.back().second = b + e.numel;
    else
      ranges.push_back({b, b + e.numel});
  }
}

void TensorParallelGrads::grads_ready(int u) {
  if (tp_.active() && dp_.reduces_this_micro())
    for (const auto& [b, e] : partial_[size_t(u)])
      tp_.data_comm().all_reduce(store_.unit_grads(u) + b, size_t(e - b), DType::f32, ReduceOp::sum);
  dp_.grads_ready(u);
}

}  // namespace mt::parallel
