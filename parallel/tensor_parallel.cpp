#include "parallel/tensor_parallel.h"

#include "runtime/check.h"

namespace mt::parallel {

TensorParallel::TensorParallel(Comm& tp, bool sp) : comm_(&tp), size_(tp.size()), rank_(tp.rank()), sp_(sp) {}

Comm& TensorParallel::comm() const {
  MT_CHECK(comm_ != nullptr, "tensor parallelism without a communicator");
  return *comm_;
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
  for (int i = 0; i < int(store.entries().size()); i++)
    if (store.entry(i).partial_grad & kAxisTp) partial_[size_t(store.entry(i).unit)].push_back(i);
}

void TensorParallelGrads::grads_ready(int u) {
  if (tp_.active() && dp_.reduces_this_micro())
    for (int i : partial_[size_t(u)])
      tp_.comm().all_reduce(store_.grad(i), size_t(store_.entry(i).numel), DType::f32, ReduceOp::sum);
  dp_.grads_ready(u);
}

}  // namespace mt::parallel
