// Shared by the checkpoint tests: a training-like state (random tensors of odd sizes), its split
// into per-rank pieces the way ZeRO shards a flat buffer, and "ranks" simulated in one process.
//
// Simulated ranks: the checkpoint's background threads coordinate through files only, so several
// Checkpointers in one process, each with a FakeComm of its own rank, behave like ranks of a job.
// FakeComm's broadcast hands root's buffer to the others through a shared slot (the root must call
// first); its all-reduce is the identity (callers make every rank pass the same step).
#pragma once
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "parallel/comm.h"
#include "runtime/check.h"

namespace mt::checkpoint::testing {

struct FakeWorld {
  std::vector<char> broadcast_slot;
};

class FakeComm final : public parallel::Comm {
 public:
  FakeComm(int rank, int size, FakeWorld& w) : Comm(rank, size, Device::cpu, "fake"), w_(w) {}

 protected:
  parallel::CommHandle do_all_reduce(void*, size_t, DType, parallel::ReduceOp) override { return {}; }
  parallel::CommHandle do_broadcast(void* buf, size_t count, DType t, int root) override {
    const size_t n = count * dtype_size(t);
    if (rank() == root)
      w_.broadcast_slot.assign(static_cast<char*>(buf), static_cast<char*>(buf) + n);
    else
      std::memcpy(buf, w_.broadcast_slot.data(), n);
    return {};
  }
  parallel::CommHandle do_reduce_scatter(const void*, void*, size_t, DType, parallel::ReduceOp) override { no(); }
  parallel::CommHandle do_all_gather(const void*, void*, size_t, DType) override { no(); }
  parallel::CommHandle do_all_to_all_v(const void*, std::span<const size_t>, void*, std::span<const size_t>,
                                       DType) override { no(); }
  parallel::CommHandle do_send_recv(const void*, size_t, int, void*, size_t, int, DType, int) override { no(); }
  parallel::CommHandle do_barrier() override { return {}; }
  std::unique_ptr<Comm> do_split(int, int, const std::string&, Arena*) override { no(); }

 private:
  [[noreturn]] static void no() { fail("FakeComm: operation not simulated"); }
  FakeWorld& w_;
};

// Tensors "param/...", "adam_m/...", "adam_v/..." with random shapes (odd and prime sizes
// included) and random values.
struct State {
  std::vector<TensorInfo> tensors;
  std::vector<std::vector<float>> values;  // per tensor, row-major

  static State random(std::mt19937_64& rng, int num_params = 5, int64_t max_dim = 97) {
    State s;
    std::uniform_real_distribution<float> val(-2.f, 2.f);
    std::vector<std::vector<int64_t>> shapes;
    for (int i = 0; i < num_params; i++) {
      std::vector<int64_t> shape;
      const int ndim = 1 + int(rng() % 2);
      for (int d = 0; d < ndim; d++) shape.push_back(1 + int64_t(rng() % uint64_t(max_dim)));
      shapes.push_back(shape);
    }
    for (const char* group : {"param/", "adam_m/", "adam_v/"})
      for (int i = 0; i < num_params; i++) {
        TensorInfo t{std::string(group) + "h." + std::to_string(i) + ".weight", shapes[size_t(i)], DType::f32};
        std::vector<float> v(size_t(t.numel()));
        for (float& x : v) x = val(rng);
        s.tensors.push_back(t);
        s.values.push_back(std::move(v));
      }
    return s;
  }

  int64_t total() const {
    int64_t n = 0;
    for (const TensorInfo& t : tensors) n += t.numel();
    return n;
  }

  // The pieces rank `rank` of `ranks` holds when the concatenation of all tensors is cut into
  // near-equal flat chunks (ZeRO's flat sharding), each chunk split again at tensor boundaries.
  std::vector<Piece> pieces(int rank, int ranks) const {
    const int64_t n = total();
    const int64_t lo = n * rank / ranks, hi = n * (rank + 1) / ranks;
    std::vector<Piece> out;
    int64_t base = 0;
    for (size_t i = 0; i < tensors.size(); i++) {
      const int64_t b = std::max(lo, base), e = std::min(hi, base + tensors[i].numel());
      if (b < e) out.push_back({tensors[i].name, b - base, e - base, values[i].data() + (b - base)});
      base += tensors[i].numel();
    }
    return out;
  }

  SaveRequest request(int64_t step, int rank, int ranks) const {
    SaveRequest r;
    r.step = step;
    r.tensors = tensors;
    r.pieces = pieces(rank, ranks);
    r.rank_meta = {{"rank", rank}, {"loader", {{"position", 1000 * rank + step}}}};
    r.global_meta = {{"model", {{"n_layer", 2}}}, {"step", step}};
    return r;
  }
};

// `ranks` Checkpointers on FakeComms, created rank 0 first (it cleans the directory).
struct SimulatedJob {
  FakeWorld world;
  std::vector<std::unique_ptr<FakeComm>> comms;
  std::vector<std::unique_ptr<Checkpointer>> ranks;

  SimulatedJob(int n, const Options& o, const std::vector<Options>& per_rank = {}) {
    for (int r = 0; r < n; r++) {
      comms.push_back(std::make_unique<FakeComm>(r, n, world));
      ranks.push_back(std::make_unique<Checkpointer>(per_rank.empty() ? o : per_rank[size_t(r)], *comms.back()));
    }
  }
  // Async saves only: every rank's save() returns at once, so one thread can play all of them.
  void save(const State& s, int64_t step) {
    for (size_t r = 0; r < ranks.size(); r++) ranks[r]->save(s.request(step, int(r), int(ranks.size())));
  }
  void wait() {
    for (auto& c : ranks) c->wait();
  }
};

// Reads a whole file as bytes.
inline std::string file_bytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot open %s", path.c_str());
  std::string s;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  std::fclose(f);
  return s;
}

inline void write_bytes(const std::string& path, const std::string& s) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("cannot open %s", path.c_str());
  std::fwrite(s.data(), 1, s.size(), f);
  std::fclose(f);
}

// A Logger whose lines can be inspected (open_memstream).
struct CapturedLog {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  Logger logger{LogLevel::info, -1, f};
  std::string text() {
    std::fflush(f);
    return std::string(buf, len);
  }
  ~CapturedLog() {
    std::fclose(f);
    std::free(buf);
  }
};

}  // namespace mt::checkpoint::testing
