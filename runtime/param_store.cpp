#include "runtime/param_store.h"

#include "runtime/check.h"

namespace mt {

void ParamStore::begin_unit(const std::string& name) {
  MT_CHECK(!finalized_, "ParamStore::begin_unit('%s') after finalize", name.c_str());
  units_.push_back(ParamUnit{name, 0, 0});
}

int ParamStore::add(const std::string& name, std::vector<int64_t> shape, bool weight_decay) {
  std::vector<int64_t> global = shape;
  ParamBox whole{shape, std::vector<int64_t>(shape.size(), 0), shape};
  return add_part(name, std::move(shape), std::move(global), std::move(whole), weight_decay);
}

int ParamStore::add_part(const std::string& name, std::vector<int64_t> shape, std::vector<int64_t> global_shape,
                         ParamBox box, bool weight_decay, uint8_t replicated, uint8_t partial_grad) {
  MT_CHECK(!finalized_, "ParamStore::add('%s') after finalize", name.c_str());
  MT_CHECK(!index_.count(name), "parameter '%s' registered twice", name.c_str());
  if (units_.empty()) begin_unit("all");
  ParamEntry e;
  e.name = name;
  e.numel = 1;
  for (int64_t d : shape) {
    MT_CHECK(d > 0, "parameter '%s' has a non-positive dimension", name.c_str());
    e.numel *= d;
  }
  int64_t global_numel = 1, space_numel = 1;
  for (int64_t d : global_shape) global_numel *= d;
  for (int64_t d : box.space) space_numel *= d;
  MT_CHECK(box.offset.size() == box.space.size() && box.extent.size() == box.space.size() &&
               space_numel == global_numel && box.numel() == e.numel,
           "parameter '%s': its box does not match its local and global shapes", name.c_str());
  for (size_t d = 0; d < box.space.size(); d++)
    MT_CHECK(box.offset[d] >= 0 && box.extent[d] > 0 && box.offset[d] + box.extent[d] <= box.space[d],
             "parameter '%s': its box leaves the global tensor along dimension %zu", name.c_str(), d);
  e.global_shape = std::move(global_shape);
  e.box = std::move(box);
  e.shape = std::move(shape);
  e.weight_decay = weight_decay;
  e.replicated = replicated;
  e.partial_grad = partial_grad;
  e.unit = int(units_.size()) - 1;
  entries_.push_back(std::move(e));
  index_[entries_.back().name] = int(entries_.size()) - 1;
  return int(entries_.size()) - 1;
}

void ParamStore::finalize(Arena& arena, DType compute_dtype, int shard_multiple, Storage storage) {
  MT_CHECK(!finalized_, "ParamStore finalized twice");
  MT_CHECK(shard_multiple >= 1, "shard_multiple must be >= 1");
  compute_dtype_ = compute_dtype;
  mem_ = arena.mem();
  shard_multiple_ = shard_multiple;
  // Offsets: entries 16-aligned inside their unit, units padded to a multiple of 16 x shards.
  const int64_t unit_align = 16 * int64_t(shard_multiple);
  int64_t pos = 0;
  size_t k = 0;
  for (int u = 0; u < int(units_.size()); u++) {
    units_[size_t(u)].begin = pos;
    for (; k < entries_.size() && entries_[k].unit == u; k++) {
      entries_[k].offset = pos;
      pos += (entries_[k].numel + 15) / 16 * 16;
    }
    pos = (pos + unit_align - 1) / unit_align * unit_align;
    if (pos == units_[size_t(u)].begin) pos += unit_align;  // an empty unit still has one chunk per shard
    units_[size_t(u)].end = pos;
  }
  total_ = pos;
  const size_t bytes = size_t(total_) * sizeof(float);
  master_ = arena.alloc(MemCategory::params, bytes);
  storage_ = storage;
  unit_compute_.assign(units_.size(), nullptr);
  unit_grads_.assign(units_.size(), nullptr);
  if (full_compute()) {
    // In fp32 the compute weights equal the master: one buffer serves both (16 bytes of model state
    // per parameter instead of 20) until a sharding engine releases the full master. In bf16/fp16
    // they are a 16-bit copy (18 bytes).
    char* compute = static_cast<char*>(master_.data());
    if (compute_dtype != DType::f32) {
      compute_ = arena.alloc(MemCategory::params, compute_bytes(total_));
      compute = static_cast<char*>(compute_.data());
    }
    for (size_t u = 0; u < units_.size(); u++) unit_compute_[u] = compute + compute_bytes(units_[u].begin);
  }
  if (full_grads()) {
    grads_ = arena.alloc(MemCategory::grads, bytes);
    for (size_t u = 0; u < units_.size(); u++) unit_grads_[u] = grads_.f32() + units_[u].begin;
  }
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

bool ParamStore::compute_aliases_master() const {
  return full_compute() && !compute_ && master_ && compute_dtype_ == DType::f32;
}

float* ParamStore::master(int i) const {
  MT_CHECK(master_, "the full master weights were released (ZeRO keeps only a shard)");
  return master() + entries_[size_t(i)].offset;
}

void* ParamStore::compute_entry(int i) const {
  const ParamEntry& e = entries_[size_t(i)];
  char* base = static_cast<char*>(unit_compute_[size_t(e.unit)]);
  MT_CHECK(base != nullptr, "parameters of unit '%s' are not materialised", units_[size_t(e.unit)].name.c_str());
  return base + compute_bytes(e.offset - units_[size_t(e.unit)].begin);
}

float* ParamStore::grad(int i) const {
  settle(i);
  const ParamEntry& e = entries_[size_t(i)];
  float* base = unit_grads_[size_t(e.unit)];
  MT_CHECK(base != nullptr, "gradients of unit '%s' are not materialised", units_[size_t(e.unit)].name.c_str());
  return base + (e.offset - units_[size_t(e.unit)].begin);
}

void ParamStore::set_unit_compute(int u, void* compute) {
  MT_CHECK(!full_compute(), "set_unit_compute on a store with full compute storage");
  unit_compute_[size_t(u)] = compute;
}

void ParamStore::set_unit_grads(int u, float* grads) {
  MT_CHECK(!full_grads(), "set_unit_grads on a store with full gradient storage");
  unit_grads_[size_t(u)] = grads;
}

void ParamStore::release_master() {
  // An fp32 store's compute weights are the master's buffer: it stays, as the compute copy only.
  if (compute_aliases_master()) compute_ = std::move(master_);
  master_.reset();
}

void ParamStore::refresh_compute() {
  MT_CHECK(full_compute() && master_, "refresh_compute needs full compute storage and the full master");
  if (compute_aliases_master()) return;  // fp32: the same buffer
  mem_.narrow(compute(), master(), total_, compute_dtype_);
}

void ParamStore::zero_grads() {
  MT_CHECK(full_grads(), "zero_grads needs full gradient storage");
  waiting_.assign(entries_.size(), 1);
  num_waiting_ = int64_t(entries_.size());
}

void ParamStore::settle(int i) const {
  if (num_waiting_ == 0 || !waiting_[size_t(i)]) return;
  const ParamEntry& e = entries_[size_t(i)];
  mem_.zero(grads_.f32() + e.offset, size_t(e.numel) * sizeof(float));
  waiting_[size_t(i)] = 0;
  num_waiting_--;
}

void ParamStore::settle_grads() const {
  for (int i = 0; num_waiting_ > 0 && i < int(entries_.size()); i++) settle(i);
}

float* ParamStore::grads() const {
  if (!full_grads()) return nullptr;
  settle_grads();
  return grads_.f32();
}

float* ParamStore::grads_settled(int64_t begin, int64_t end) const {
  if (!full_grads()) return nullptr;
  for (int i = 0; num_waiting_ > 0 && i < int(entries_.size()); i++) {
    const ParamEntry& e = entries_[size_t(i)];
    if (e.offset < end && e.offset + e.numel > begin) settle(i);
  }
  return grads_.f32();
}

float* ParamStore::unit_grads(int u) const {
  if (num_waiting_ > 0) {
    const ParamUnit& unit = units_[size_t(u)];
    grads_settled(unit.begin, unit.end);
  }
  return unit_grads_[size_t(u)];
}

float* ParamStore::grad_for_write(int i, int64_t n, bool* assign) {
  *assign = num_waiting_ > 0 && waiting_[size_t(i)] && n == entries_[size_t(i)].numel;
  if (*assign) {
    waiting_[size_t(i)] = 0;
    num_waiting_--;
  }
  return grad(i);
}

}  // namespace mt
