// Waits on peers (parallel/comm.h WaitPolicy, parallel/flight_recorder.h) without MPI: a backend whose
// ops complete after a given number of polls, or never (a peer that is stopped).
#include <gtest/gtest.h>

#include <string>

#include "parallel/comm.h"
#include "parallel/flight_recorder.h"

namespace mt::parallel {
namespace {

// Completes after `polls` calls of test() (-1: never).
class CountdownOp : public PendingOp {
 public:
  explicit CountdownOp(int polls) : left_(polls) {}
  bool test() override { return left_ == 0 || (left_ > 0 && --left_ == 0); }
  void wait() override { ADD_FAILURE() << "Comm must poll test(), never block in a backend's wait()"; }

 private:
  int left_;
};

// A two-rank communicator (rank 0) whose every op needs `polls` polls to complete.
class CountdownComm final : public Comm {
 public:
  CountdownComm(std::string name, int polls) : Comm(0, 2, Device::cpu, std::move(name)), polls_(polls) {}
  int polls_;

 protected:
  CommHandle op() { return CommHandle(std::make_unique<CountdownOp>(polls_)); }
  CommHandle do_all_reduce(void*, size_t, DType, ReduceOp) override { return op(); }
  CommHandle do_reduce_scatter(const void*, void*, size_t, DType, ReduceOp) override { return op(); }
  CommHandle do_all_gather(const void*, void*, size_t, DType) override { return op(); }
  CommHandle do_all_to_all_v(const void*, std::span<const size_t>, void*, std::span<const size_t>, DType) override {
    return op();
  }
  CommHandle do_broadcast(void*, size_t, DType, int) override { return op(); }
  CommHandle do_send_recv(const void*, size_t, int, void*, size_t, int, DType, int) override { return op(); }
  CommHandle do_barrier() override { return op(); }
  std::unique_ptr<Comm> do_split(int, int, const std::string& name, Arena*) override {
    return std::make_unique<CountdownComm>(name, polls_);
  }
};

TEST(PeerWait, AStoppedPeerTimesOutNamingTheGroupOpAndSequenceNumber) {
  CountdownComm c("dp", 5);
  float x = 1;
  c.all_reduce(&x, 1, DType::f32, ReduceOp::sum);  // #1, #2: healthy
  c.broadcast(&x, 1, DType::f32, 0);
  c.polls_ = -1;  // the peer stops
  int called = 0;
  c.set_wait_policy({0.02, [&] {
                       called++;
                       return std::string("records written");
                     }});
  try {
    c.all_reduce(&x, 1, DType::f32, ReduceOp::sum);
    FAIL() << "a wait on a stopped peer returned";
  } catch (const PeerTimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("hung: all_reduce #3 on group 'dp' (rank 0 of 2 there)"), std::string::npos) << what;
    EXPECT_NE(what.find("dist.timeout=0.02"), std::string::npos) << what;
    EXPECT_NE(what.find("; records written"), std::string::npos) << what;
    EXPECT_EQ(e.exit_status(), kExitHung);
  }
  EXPECT_EQ(called, 1);
  const std::vector<CommRecord> r = c.flight_recorder().records();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].state, OpState::completed);
  EXPECT_STREQ(r[1].op, "broadcast");
  EXPECT_EQ(r[2].seq, 3u);
  EXPECT_EQ(r[2].state, OpState::timed_out);
  const std::string jsonl = flight_records_jsonl(c);
  EXPECT_NE(jsonl.find(R"("group":"dp","rank":0,"size":2,"seq":3,"op":"all_reduce","bytes":4)"), std::string::npos)
      << jsonl;
  EXPECT_NE(jsonl.find(R"("state":"timed_out")"), std::string::npos) << jsonl;
}

TEST(PeerWait, EveryBlockingFormWaitsUnderThePolicy) {
  CountdownComm c("pp", -1);
  c.set_wait_policy({0.01, nullptr});
  float x = 0;
  EXPECT_THROW(c.barrier(), PeerTimeoutError);
  EXPECT_THROW(c.recv(&x, 1, DType::f32, 1), PeerTimeoutError);
  EXPECT_THROW(c.send_recv(&x, 1, 1, &x, 1, 1, DType::f32), PeerTimeoutError);
  CommHandle h = c.all_gather_async(&x, &x, 1, DType::f32);
  EXPECT_FALSE(h.test());
  EXPECT_THROW(h.wait(), PeerTimeoutError);
  try {
    c.send(&x, 1, DType::f32, 1, 3);
    FAIL() << "a send to a stopped peer returned";
  } catch (const PeerTimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("hung: send #5 to rank 1 on group 'pp'"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(h.done());  // a wait that timed out abandons its op: dropping the handle does not wait again
}

TEST(PeerWait, SplitCommunicatorsInheritThePolicy) {
  CountdownComm c("world", -1);
  c.set_wait_policy({0.01, [] { return std::string("x"); }});
  std::unique_ptr<Comm> tp = c.split(0, 0, "tp");
  EXPECT_EQ(tp->wait_policy().timeout_s, 0.01);
  EXPECT_TRUE(bool(tp->wait_policy().on_timeout));
  EXPECT_THROW(tp->barrier(), PeerTimeoutError);
}

TEST(PeerWait, HealthyWaitsCountAsBlockedTimeAndEndTheirRecords) {
  CountdownComm c("dp", 3);
  EXPECT_EQ(c.blocked_seconds(), 0.0);
  float x = 0;
  c.all_reduce(&x, 1, DType::f32, ReduceOp::sum);
  EXPECT_GT(c.blocked_seconds(), 0.0);
  EXPECT_EQ(c.flight_recorder().records().back().state, OpState::completed);
  EXPECT_GT(c.flight_recorder().records().back().ended, 0.0);
}

// A host wait on the device (Comm::wait_for_device, what the Mesh's DeviceWait runs): recorded and
// bounded like a wait on peers, the device's readiness polled with the backend's failure check.
TEST(PeerWait, AHostWaitOnTheDeviceTimesOutLikeAWaitOnPeers) {
  CountdownComm c("dp.nccl", 1);
  int polls = 0;
  c.wait_for_device([&] { return ++polls == 3; }, "device sync");
  EXPECT_EQ(polls, 3);
  EXPECT_STREQ(c.flight_recorder().records().back().op, "device sync");
  EXPECT_EQ(c.flight_recorder().records().back().state, OpState::completed);
  int called = 0;
  c.set_wait_policy({0.02, [&] {
                       called++;
                       return std::string("records written");
                     }});
  try {
    c.wait_for_device([] { return false; }, "device sync");  // the stream sits behind a hung collective
    FAIL() << "a wait on device work that never completes returned";
  } catch (const PeerTimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("hung: device sync #2 on group 'dp.nccl' (rank 0 of 2 there)"), std::string::npos) << what;
    EXPECT_NE(what.find("; records written"), std::string::npos) << what;
    EXPECT_EQ(e.exit_status(), kExitHung);
  }
  EXPECT_EQ(called, 1);
  EXPECT_EQ(c.flight_recorder().records().back().state, OpState::timed_out);
}

TEST(FlightRecorder, KeepsTheLastRecordsOldestFirst) {
  FlightRecorder f;
  const size_t n = FlightRecorder::kCapacity + 5;
  for (size_t i = 0; i < n; i++) f.issue("send", i, 1, -1);
  f.end(3, OpState::completed);  // left the ring: nothing happens
  f.end(n, OpState::timed_out);
  const std::vector<CommRecord> r = f.records();
  ASSERT_EQ(r.size(), FlightRecorder::kCapacity);
  EXPECT_EQ(r.front().seq, 6u);
  EXPECT_EQ(r.back().seq, uint64_t(n));
  EXPECT_EQ(r.back().state, OpState::timed_out);
  EXPECT_EQ(r.front().state, OpState::issued);
  EXPECT_EQ(f.last_seq(), uint64_t(n));
}

TEST(PeerWait, PollWithBackoffGivesUpAtTheTimeoutOnly) {
  double waited = -1;
  int polls = 0;
  EXPECT_TRUE(poll_with_backoff([&] { return ++polls == 4; }, 1e9, &waited));
  EXPECT_EQ(polls, 4);
  EXPECT_FALSE(poll_with_backoff([] { return false; }, 0.005, &waited));
  EXPECT_GE(waited, 0.005);
}

}  // namespace
}  // namespace mt::parallel
