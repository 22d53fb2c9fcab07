// Data parallelism on one rank over a store whose gradients wait for their
// first writers (ParamStore::zero_grads): an entry no micro-batch wrote in a
// step (an expert that got no rows) reads as zero in the gradient shard the
// norm and the optimizer read once the gradients are finished, not as the
// previous step's values: whether the unit was handed over to be reduced during
// backward (grads_ready) or not (a model run without the hooks).
#include <gtest/gtest.h>

#include <algorithm>

#include "parallel/data_parallel.h"
#include "parallel/self_comm.h"

namespace mt::parallel {
namespace {

TEST(DataParallel, AnEntryNoMicroBatchWroteReadsAsZeroOnceTheGradientsAreFinished) {
  for (int zero : {0, 1})
    for (bool handed : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "zero " << zero << (handed ? ", unit handed over" : ", no hooks"));
      ParamStore store;
      const int used = store.add("used", {8, 4}, true), idle = store.add("idle", {5, 3}, true);
      Arena arena;
      store.finalize(arena, DType::f32);
      SelfComm self;
      DataParallelOptions o;
      o.zero = zero;
      DataParallel dp(store, self, arena, o, ops::Ctx());
      const auto shard_of = [&](int i) {  // one rank, one unit: the shard is laid out as the store
        return dp.grad_shard() + store.entry(i).offset;
      };
      for (int step = 0; step < 2; step++) {
        dp.begin_step();
        dp.set_last_micro(true);
        bool assign = false;
        std::fill_n(store.grad_for_write(used, 32, &assign), 32, 2.f);
        EXPECT_TRUE(assign) << "the step's first write of the whole entry";
        if (step == 0) std::fill_n(store.grad(idle), 15, 9.f);  // a gradient in step 0 only
        if (handed) dp.grads_ready(0);
        dp.finish_grads();
        EXPECT_TRUE(std::all_of(shard_of(used), shard_of(used) + 32, [](float x) { return x == 2.f; }));
        const float want = step == 0 ? 9.f : 0.f;
        EXPECT_TRUE(std::all_of(shard_of(idle), shard_of(idle) + 15, [want](float x) { return x == want; }))
            << "step " << step << ": the idle entry's gradient is not " << want;
      }
    }
}

}  // namespace
}  // namespace mt::parallel
