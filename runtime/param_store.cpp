#include "runtime/param_store.h"

#include <cstring>

#include "runtime/check.h"

namespace mt {

int ParamStore::add(const std::string& name, std::vector<int64_t> shape, bool weight_decay) {
  MT_CHECK(!finalized_, "ParamStore::add('%s') after finalize", name.c_str());
  MT_CHECK(!index_.count(name), "parameter '%s' registered twice", name.c_str());
  ParamEntry e;
  e.name = name;
  e.numel = 1;
  for (int64_t d : shape) {
    MT_CHECK(d > 0, "parameter '%s' has a non-positive dimension", name.c_str());
    e.numel *= d;
  }
  e.global_shape = shape;
  e.global_offset.assign(shape.size(), 0);
  e.shape = std::move(shape);
  e.weight_decay = weight_decay;
  e.offset = total_;
  total_ += (e.numel + 15) / 16 * 16;
  entries_.push_back(std::move(e));
  index_[entries_.back().name] = int(entries_.size()) - 1;
  return int(entries_.size()) - 1;
}

void ParamStore::finalize(Arena& arena, DType compute_dtype) {
  MT_CHECK(!finalized_, "ParamStore finalized twice");
  compute_dtype_ = compute_dtype;
  size_t bytes = size_t(total_) * sizeof(float);
  master_ = arena.alloc(MemCategory::params, bytes);
  compute_ = arena.alloc(MemCategory::params, bytes);
  grads_ = arena.alloc(MemCategory::grads, bytes);
  finalized_ = true;
}

int64_t ParamStore::param_count() const {
  int64_t n = 0;
  for (const auto& e : entries_) n += e.numel;
  return n;
}

const ParamEntry* ParamStore::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[size_t(it->second)];
}

void round_inplace(float* x, int64_t n, DType t) {
  if (t == DType::bf16) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] = round_bf16(x[i]);
  } else if (t == DType::f16) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] = round_f16(x[i]);
  }
}

void ParamStore::refresh_compute() {
  std::memcpy(compute(), master(), size_t(total_) * sizeof(float));
  round_inplace(compute(), total_, compute_dtype_);
}

void ParamStore::zero_grads() { std::memset(grads(), 0, size_t(total_) * sizeof(float)); }

}  // namespace mt
