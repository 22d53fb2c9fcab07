// The Chrome trace writer: spans only while recording, lanes named in order of first use, the JSON a
// trace viewer reads (metadata naming the process and lanes, complete events in microseconds), the
// event cap counting what it drops, and a whole file or none.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/check.h"
#include "runtime/trace.h"
#include "tests/test_util.h"

namespace mt {
namespace {

nlohmann::json spans_of(const nlohmann::json& doc) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "X") out.push_back(e);
  return out;
}

TEST(Trace, RecordsSpansOnlyWhileRecordingOnNamedLanes) {
  Trace t(3, "rank 3 TP(0)-DP(1)");
  EXPECT_EQ(t.lane("step"), 0);
  EXPECT_EQ(t.lane("ops"), 1);
  EXPECT_EQ(t.lane("step"), 0);  // the same lane again
  { const Trace::Span s(&t, 1, "op", "not recorded"); }
  t.set_recording(true);
  { const Trace::Span s(&t, 0, "step", "step 2"); { const Trace::Span o(&t, 1, "op", "matmul_fwd"); } }
  { const Trace::Span none(nullptr, 0, "step", "no trace"); }
  t.set_recording(false);
  { const Trace::Span s(&t, 1, "op", "after"); }
  ASSERT_EQ(t.events(), 2u);
  const nlohmann::json doc = nlohmann::json::parse(t.json());
  const nlohmann::json spans = spans_of(doc);
  ASSERT_EQ(spans.size(), 2u);
  // Inner spans end first; both belong to process 3, on their lanes, times in microseconds.
  EXPECT_EQ(spans[0]["name"], "matmul_fwd");
  EXPECT_EQ(spans[0]["tid"], 1);
  EXPECT_EQ(spans[1]["name"], "step 2");
  EXPECT_EQ(spans[1]["pid"], 3);
  EXPECT_GE(spans[0]["dur"].get<double>(), 0.0);
  EXPECT_GE(spans[0]["ts"].get<double>(), spans[1]["ts"].get<double>());
  EXPECT_LE(spans[0]["ts"].get<double>() + spans[0]["dur"].get<double>(),
            spans[1]["ts"].get<double>() + spans[1]["dur"].get<double>());
  int named = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "M") continue;
    if (e["name"] == "process_name") {
      EXPECT_EQ(e["args"]["name"], "rank 3 TP(0)-DP(1)");
    }
    if (e["name"] == "thread_name") named++;
  }
  EXPECT_EQ(named, 2);
}

TEST(Trace, KeepsAtMostMaxEventsAndCountsTheRest) {
  Trace t(0, "rank 0", 5);
  t.set_recording(true);
  const int lane = t.lane("comm dp");
  for (int i = 0; i < 8; i++) t.add("all_reduce", "comm", lane, Trace::Clock::now(), Trace::Clock::now(), "{\"bytes\": 64}");
  EXPECT_EQ(t.events(), 5u);
  EXPECT_EQ(t.dropped(), 3u);
  const nlohmann::json doc = nlohmann::json::parse(t.json());
  EXPECT_EQ(doc["otherData"]["dropped_events"], 3);
  EXPECT_EQ(spans_of(doc)[0]["args"]["bytes"], 64);
}

TEST(Trace, WritesAWholeFileOrFailsNamingIt) {
  const std::string dir = testing::make_temp_dir("mt_trace");
  Trace t(1, "rank 1");
  t.set_recording(true);
  t.add("x", "op", t.lane("ops"), Trace::Clock::now(), Trace::Clock::now());
  t.write(dir + "/rank_00001.json");
  std::ifstream f(dir + "/rank_00001.json");
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_EQ(text.str(), t.json());
  EXPECT_FALSE(std::filesystem::exists(dir + "/rank_00001.json.tmp"));
  try {
    t.write(dir + "/missing/rank_00001.json");
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing/rank_00001.json"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mt
