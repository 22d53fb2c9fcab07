// The pipeline executor over real point-to-point messages, apart from any model: toy stages whose
// every message says which stage made it for which micro-batch, so a message delivered to the wrong
// action, out of order, twice or only in part is seen where it is consumed. Both pairings run every
// schedule: `ahead` (receives posted one compute action early, the host path) and `paired` (one
// send_recv per exchange point, or two at an interleaved schedule's merged points: the path NCCL needs;
// parallel/pipeline_exchange.h), here over MPI, interleaved p = 2, m = 4, v = 2 included (it deadlocked
// when each compute action's messages were paired on their own).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/pipeline_executor.h"
#include "parallel/pipeline_sim.h"
#include "runtime/memory.h"
#include "tests/mpi/mpi_test_util.h"

namespace mt::testing {
namespace {

using parallel::Action;
using parallel::ActionKind;

constexpr size_t kElems = 4096;  // 16 KiB: past the shared-memory transport's eager limit

// Stage s's forward of micro-batch k sends 1000 k + s; its backward sends -(1000 k + s) - 1.
float activation(int stage, int micro) { return float(1000 * micro + stage); }
float gradient(int stage, int micro) { return -float(1000 * micro + stage) - 1; }

class ToyStages final : public parallel::PipelineStages {
 public:
  ToyStages(const parallel::Schedule& s, int rank, Arena& arena) : s_(s), rank_(rank), arena_(arena) {}

  size_t message_elems() const override { return kElems; }
  DType message_dtype() const override { return DType::f32; }
  Buffer alloc_message() override { return arena_.alloc_uninitialized(MemCategory::activations, kElems * 4); }
  void before(const Action&, bool) override {}

  Buffer forward(int chunk, int micro, Buffer in) override {
    const int st = s_.stage(rank_, chunk);
    if (st > 0) expect(in, activation(st - 1, micro), "F", chunk, micro);
    forwards_.insert({chunk, micro});
    return st + 1 < s_.stages() ? filled(activation(st, micro)) : Buffer();
  }
  Buffer backward(int chunk, int micro, Buffer dy) override {
    const int st = s_.stage(rank_, chunk);
    if (!forwards_.count({chunk, micro})) errors_.push_back(strfmt("B of chunk %d micro %d before F", chunk, micro));
    if (st + 1 < s_.stages()) expect(dy, gradient(st + 1, micro), "B", chunk, micro);
    backwards_.insert({chunk, micro});
    return st > 0 ? filled(gradient(st, micro)) : Buffer();
  }
  Buffer backward_input(int chunk, int micro, Buffer dy) override { return backward(chunk, micro, std::move(dy)); }
  void backward_weight(int chunk, int micro) override {
    if (!backwards_.count({chunk, micro}))
      errors_.push_back(strfmt("W of chunk %d micro %d before B_input", chunk, micro));
  }

  const std::vector<std::string>& errors() const { return errors_; }
  size_t backwards() const { return backwards_.size(); }

 private:
  Buffer filled(float v) {
    Buffer b = alloc_message();
    for (size_t i = 0; i < kElems; i++) b.f32()[i] = v;
    return b;
  }
  void expect(const Buffer& b, float want, const char* what, int chunk, int micro) {
    size_t bad = 0;
    for (size_t i = 0; b && i < kElems; i++) bad += b.f32()[i] != want;
    if (!b || bad)
      errors_.push_back(strfmt("%s of chunk %d micro %d on rank %d: %zu of %zu elements are not %g (first %g)", what,
                               chunk, micro, rank_, b ? bad : kElems, kElems, double(want),
                               b ? double(b.f32()[0]) : 0.0));
  }

  const parallel::Schedule& s_;
  int rank_;
  Arena& arena_;
  std::set<std::pair<int, int>> forwards_, backwards_;
  std::vector<std::string> errors_;
};

TEST(PipelineExecutor, BothPairingsDeliverEveryMessageToItsAction) {
  parallel::Comm& world = mpi_world().comm();
  const int p = world.size();
  Arena arena(host_memory());
  std::vector<parallel::ScheduleSpec> specs;
  for (int m : {1, 3, 2 * p}) {
    specs.push_back({parallel::ScheduleKind::gpipe, p, m, 1});
    specs.push_back({parallel::ScheduleKind::one_f_one_b, p, m, 1});
    specs.push_back({parallel::ScheduleKind::zb1, p, m, 1});
  }
  specs.push_back({parallel::ScheduleKind::interleaved, p, 2 * p, 2});
  for (const parallel::ScheduleSpec& spec : specs)
    for (parallel::Pairing pairing : {parallel::Pairing::ahead, parallel::Pairing::paired}) {
      const std::string what = strfmt("%s p=%d m=%d v=%d %s", parallel::schedule_kind_name(spec.kind), spec.p, spec.m,
                                      spec.v, pairing == parallel::Pairing::ahead ? "ahead" : "paired");
      parallel::Schedule s = parallel::build_schedule(spec);
      parallel::validate_schedule(s);
      int sends = 0;
      for (const Action& a : s.ranks[size_t(world.rank())])
        sends += a.kind == ActionKind::send_activation || a.kind == ActionKind::send_gradient;
      parallel::PipelineExecutor exec(s, world, pairing);
      ToyStages stages(s, world.rank(), arena);
      for (int step = 0; step < 2; step++) exec.run(stages);  // a second step reuses nothing stale
      for (const std::string& e : stages.errors()) ADD_FAILURE() << what << ": " << e;
      EXPECT_EQ(stages.backwards(), size_t(spec.m * spec.v)) << what;
      EXPECT_EQ(exec.stats().messages_sent, sends) << what;
      int32_t failed = stages.errors().empty() ? 0 : 1;
      world.all_reduce(&failed, 1, DType::i32, parallel::ReduceOp::max);
      ASSERT_EQ(failed, 0) << what << ": some rank received a wrong message";
    }
}

}  // namespace
}  // namespace mt::testing
