// Preemption's signal handling (runtime/preempt.h), the memory check before allocation
// (train/preflight.h) and the options of both and of the run's identity.
#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>

#include "config/options.h"
#include "runtime/arena.h"
#include "runtime/check.h"
#include "runtime/preempt.h"
#include "train/preflight.h"

namespace mt {
namespace {

sighandler_t current_handler(int sig) {
  struct sigaction sa {};
  sigaction(sig, nullptr, &sa);
  return sa.sa_handler;
}

TEST(Preempt, FirstSignalIsRecordedAndRestoresTheDefaultActions) {
  reset_preemption_for_tests(0);
  EXPECT_EQ(preemption_signal(), 0);
  EXPECT_NE(current_handler(SIGTERM), SIG_DFL);
  EXPECT_NE(current_handler(SIGUSR1), SIG_DFL);
  std::raise(SIGUSR1);
  EXPECT_EQ(preemption_signal(), SIGUSR1);
  // A second signal, either one, now takes the default action: the process ends at once.
  EXPECT_EQ(current_handler(SIGTERM), SIG_DFL);
  EXPECT_EQ(current_handler(SIGUSR1), SIG_DFL);
  reset_preemption_for_tests(0);
  std::raise(SIGTERM);
  EXPECT_EQ(preemption_signal(), SIGTERM);
  reset_preemption_for_tests(0);
}

// main installs the handlers before MPI starts, then again with the options' deadline: a signal in
// between is kept (not forgotten, not re-armed for a second one), and its deadline starts then.
TEST(Preempt, ASignalBeforeTheSecondInstallIsKept) {
  reset_preemption_for_tests(0);
  std::raise(SIGUSR1);
  install_preemption_handlers(3600);
  EXPECT_EQ(preemption_signal(), SIGUSR1);
  EXPECT_EQ(current_handler(SIGTERM), SIG_DFL) << "a second signal still ends the process at once";
  EXPECT_EQ(current_handler(SIGUSR1), SIG_DFL);
  EXPECT_GT(alarm(0), 0u) << "the deadline is armed by the second install";
  reset_preemption_for_tests(0);
}

// The deadline (alarm) is exercised end to end by tests/integration/preempt_test.sh `deadline`.

TEST(Preflight, RefusesAPeakOverTheMemoryAvailable) {
  const train::AvailableMemory host{uint64_t(1) << 30, "the host's MemAvailable"};
  const std::string why = train::memory_refusal(uint64_t(10) << 30, host);
  EXPECT_NE(why.find("the planned peak memory per rank, " + format_bytes(uint64_t(10) << 30)), std::string::npos) << why;
  EXPECT_NE(why.find(format_bytes(uint64_t(1) << 30) + " each rank can have (the host's MemAvailable)"), std::string::npos)
      << why;
  EXPECT_NE(why.find("mem.check=off"), std::string::npos) << why;
  EXPECT_EQ(train::memory_refusal(uint64_t(1) << 30, host), "");         // fits exactly
  EXPECT_EQ(train::memory_refusal(0, host), "");                          // no plan for the layout
  EXPECT_EQ(train::memory_refusal(uint64_t(10) << 30, {0, "unknown"}), "");  // no figure to compare
}

TEST(Preflight, ThePlannedPeakGrowsWithTheBatch) {
  config::TrainOptions o = config::parse_train_options({"model=tiny", "batch_size=4"});
  const uint64_t small = train::planned_peak(o, 1);
  o.batch_size = 2000000000;
  const uint64_t huge = train::planned_peak(o, 1);
  EXPECT_GT(small, 0u);
  EXPECT_GT(huge, uint64_t(1) << 50) << "2e9 rows of 64 tokens need petabytes of activations";
  // Two ranks of dp share a global batch: each plans half the rows.
  o.batch_size = 4;
  o.global_batch = 8;
  EXPECT_EQ(train::planned_peak(o, 2), train::planned_peak(config::parse_train_options({"model=tiny", "batch_size=4"}), 2));
}

TEST(Preflight, HostMemoryIsSharedByTheRanksOfANode) {
  const config::TrainOptions o = config::parse_train_options({"model=tiny"});
  const train::AvailableMemory one = train::available_memory(o, 0, 1), four = train::available_memory(o, 0, 4);
  ASSERT_GT(one.bytes, 0u);
  EXPECT_NEAR(double(four.bytes), double(one.bytes) / 4, double(one.bytes) * 0.05);  // MemAvailable moves a little
  EXPECT_NE(four.what.find("shared by the 4 ranks on this node"), std::string::npos) << four.what;
}

TEST(Options, RunIdentityPreemptionAndMemoryCheck) {
  const config::TrainOptions o =
      config::parse_train_options({"run_id=job-7.a_b", "preempt.deadline=30", "mem.check=off", "resume=own"});
  EXPECT_EQ(o.run_id, "job-7.a_b");
  EXPECT_EQ(o.preempt_deadline, 30);
  EXPECT_FALSE(o.mem_check);
  EXPECT_EQ(o.to_json().at("run_id"), "job-7.a_b");
  EXPECT_EQ(o.to_json().at("preempt").at("deadline"), 30);
  EXPECT_THROW(config::parse_train_options({"run_id=a b"}), Error);
  EXPECT_THROW(config::parse_train_options({"preempt.deadline=-1"}), Error);
  try {
    config::parse_train_options({"resume=own"});
    ADD_FAILURE() << "resume=own without run_id was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resume=own"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt
