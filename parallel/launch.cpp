#include "parallel/launch.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/self_comm.h"
#ifdef MT_HAVE_MPI
#include "parallel/mpi_comm.h"
#endif

namespace mt::parallel {

World::World(int* argc, char*** argv) {
#ifdef MT_HAVE_MPI
  int initialized = 0, finalized = 0;
  MT_MPI_CHECK(MPI_Initialized(&initialized));
  MT_MPI_CHECK(MPI_Finalized(&finalized));
  MT_CHECK(!initialized && !finalized, "MPI was initialised before: a process holds at most one World in its life");
  int provided = 0;
  MT_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  finalize_ = true;
  MT_CHECK(provided >= MPI_THREAD_FUNNELED,
           "the MPI library offers thread level %d; minitrain needs at least MPI_THREAD_FUNNELED", provided);
  thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
  comm_ = std::make_unique<MpiComm>(MPI_COMM_WORLD, "world");
  MPI_Comm node = MPI_COMM_NULL;
  MT_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, comm_->rank(), MPI_INFO_NULL, &node));
  MT_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  MT_MPI_CHECK(MPI_Comm_size(node, &local_size_));
  MT_MPI_CHECK(MPI_Comm_free(&node));
#else
  (void)argc;
  (void)argv;
  comm_ = std::make_unique<SelfComm>("world");
#endif
}

World::~World() {
  const double deadline_s = comm_->wait_policy().timeout_s;
  const int rank = comm_->rank(), size = comm_->size();
  comm_.reset();
#ifdef MT_HAVE_MPI
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalize_ || finalized) return;
  if (size == 1) {
    MPI_Finalize();
    return;
  }
  // MPI_Finalize waits for every rank to reach it. A rank stuck after the last collective (a write
  // that never returns, a stopped process) would hold the others here forever: past the deadline
  // (dist.timeout, as every wait on peers) this rank says so and ends with kExitHung, and mpirun
  // then ends the job.
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  // At most about 30 years: a longer wait in nanoseconds would overflow the clock's count.
  const std::chrono::duration<double> wait(std::min(deadline_s, 1e9));
  std::thread watch([&] {
    std::unique_lock<std::mutex> lock(m);
    if (cv.wait_for(lock, wait, [&] { return done; })) return;
    std::fprintf(stderr,
                 "minitrain: [rank %d] error: hung: MPI_Finalize waited %.1f s for the other ranks to finish "
                 "(dist.timeout); one of them is stuck: ending the job\n",
                 rank, deadline_s);
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(kExitHung);
  });
  MPI_Finalize();
  {
    std::lock_guard<std::mutex> lock(m);
    done = true;
  }
  cv.notify_one();
  watch.join();
#else
  (void)deadline_s, (void)rank, (void)size;
#endif
}

void World::abort(int code) const {
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef MT_HAVE_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::_Exit(code);
}

int run_main(World& world, const std::function<int(World&)>& body) {
  std::string msg;
  bool collective = false, follow_on = false, hung = false;
  int status = 1;
  int reporter = 0;  // the rank that prints a CollectiveError
  bool prefixed = false;  // whether the reporter's line carries its rank (an AgreedError's does)
  double grace_s = 5;
  try {
    return body(world);
  } catch (const PeerTimeoutError& e) {
    msg = e.what();
    hung = true;
    status = e.exit_status();
    grace_s = std::min(grace_s, e.timeout_s());
  } catch (const AgreedError& e) {
    msg = e.what();
    collective = prefixed = true;
    reporter = e.reporter();
    status = e.exit_status();
  } catch (const CollectiveError& e) {
    msg = e.what();
    collective = true;
    status = e.exit_status();
  } catch (const FollowOnError& e) {
    msg = e.what();
    follow_on = true;
  } catch (const std::exception& e) {
    msg = e.what();
  } catch (...) {
    msg = "unknown exception";
  }
  const int rank = world.rank(), size = world.size();
  if (size == 1) {
    std::fprintf(stderr, "minitrain: error: %s\n", msg.c_str());
    std::fflush(stderr);
    return status;
  }
  if (hung) {
    // Every rank whose wait expired says so itself; the other live ranks' waits expire about as
    // soon (they wait on the same peer, directly or through this rank), so the job is ended only
    // after a grace period in which they can print their own line and write their flight records.
    std::fprintf(stderr, "minitrain: [rank %d] error: %s\n", rank, msg.c_str());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::duration<double>(grace_s));
    world.abort(status);
  }
  if ((collective && rank != reporter) || follow_on) {
    // The reporter raised the same error (or the rank that caused this one its own) and is ending the
    // job; were it not, fall through after a grace period and report it here.
    std::this_thread::sleep_for(std::chrono::seconds(5));
  }
  if (collective && rank == reporter && !prefixed)
    std::fprintf(stderr, "minitrain: error: %s\n", msg.c_str());
  else
    std::fprintf(stderr, "minitrain: [rank %d] error: %s\n", rank, msg.c_str());
  world.abort(status);
}

namespace {

// How a rank's failure ranks when the ranks agree on one to report: its own cause first, then a wait
// on peers that expired (often a consequence of another rank's failure), then a failure that names
// another rank as its cause.
enum FailureRank : int32_t { kNoFailure = 0, kFollowOn = 1, kTimedOut = 2, kOwn = 3 };

FailureRank rank_failure(const std::exception_ptr& e, std::string* what, int* status) {
  if (!e) return kNoFailure;
  try {
    std::rethrow_exception(e);
  } catch (const PeerTimeoutError& x) {
    *what = x.what();
    *status = x.exit_status();
    return kTimedOut;
  } catch (const FollowOnError& x) {
    *what = x.what();
    return kFollowOn;
  } catch (const CollectiveError& x) {
    *what = x.what();
    *status = x.exit_status();
  } catch (const std::exception& x) {
    *what = x.what();
  } catch (...) {
    *what = "unknown exception";
  }
  return kOwn;
}

}  // namespace

void raise_agreed_failure(Comm& comm, std::exception_ptr mine) {
  std::string what;
  int status = 1;
  const int n = comm.size(), rank = comm.rank();
  // Each rank fills its own slot; the max over ranks is every rank's verdict.
  std::vector<int32_t> verdicts(size_t(n), kNoFailure);
  verdicts[size_t(rank)] = rank_failure(mine, &what, &status);
  comm.all_reduce(verdicts.data(), verdicts.size(), DType::i32, ReduceOp::max);
  const int32_t worst = *std::max_element(verdicts.begin(), verdicts.end());
  if (worst == kNoFailure) return;
  const int reporter = int(std::find(verdicts.begin(), verdicts.end(), worst) - verdicts.begin());
  // The reporter's text and exit status, to every rank (as words: the text padded to a multiple of 4).
  int32_t head[2] = {int32_t(std::min<size_t>(what.size(), 1u << 20)), status};
  comm.broadcast(head, 2, DType::i32, reporter);
  std::vector<int32_t> words((size_t(head[0]) + 3) / 4);
  if (rank == reporter) std::memcpy(words.data(), what.data(), size_t(head[0]));
  if (!words.empty()) comm.broadcast(words.data(), words.size(), DType::i32, reporter);
  std::string text(reinterpret_cast<const char*>(words.data()), size_t(head[0]));
  std::vector<int> also;
  for (int r = 0; r < n; r++)
    if (r != reporter && verdicts[size_t(r)] == kOwn) also.push_back(r);
  if (!also.empty()) {
    const size_t shown = std::min<size_t>(also.size(), 8);
    text += strfmt("; also failed on rank%s ", also.size() > 1 ? "s" : "");
    for (size_t k = 0; k < shown; k++) text += (k ? ", " : "") + std::to_string(also[k]);
    if (also.size() > shown) text += strfmt(" and %zu more", also.size() - shown);
  }
  throw AgreedError(text, head[1], reporter);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

// A short, printable excerpt of s around byte i.
std::string excerpt(const std::string& s, size_t i) {
  size_t from = i > 12 ? i - 12 : 0;
  std::string out = from > 0 ? "..." : "";
  for (size_t k = from; k < s.size() && k < from + 32; k++) {
    char c = s[k];
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  if (from + 32 < s.size()) out += "...";
  return out;
}

std::string describe_text_difference(const std::string& a, int ra, const std::string& b, int rb) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) i++;
  return strfmt("first difference at byte %zu: \"%s\" on rank %d, \"%s\" on rank %d", i, excerpt(a, i).c_str(), ra,
                excerpt(b, i).c_str(), rb);
}

}  // namespace

std::string describe_difference(const std::string& a, int ra, const std::string& b, int rb) {
  using nlohmann::json;
  json ja = json::parse(a, nullptr, false), jb = json::parse(b, nullptr, false);
  if (ja.is_discarded() || jb.is_discarded()) return describe_text_difference(a, ra, b, rb);
  // Flattened, every leaf is keyed by its JSON pointer ("/train/lr"), sorted.
  json fa = ja.flatten(), fb = jb.flatten();
  std::vector<std::string> diffs;
  for (auto it = fa.begin(); it != fa.end(); ++it) {
    if (!fb.contains(it.key()))
      diffs.push_back(strfmt("%s: %s on rank %d, absent on rank %d", it.key().c_str(), it.value().dump().c_str(), ra,
                             rb));
    else if (fb[it.key()] != it.value())
      diffs.push_back(strfmt("%s: %s on rank %d, %s on rank %d", it.key().c_str(), it.value().dump().c_str(), ra,
                             fb[it.key()].dump().c_str(), rb));
  }
  for (auto it = fb.begin(); it != fb.end(); ++it)
    if (!fa.contains(it.key()))
      diffs.push_back(strfmt("%s: absent on rank %d, %s on rank %d", it.key().c_str(), ra, it.value().dump().c_str(),
                             rb));
  if (diffs.empty()) return "the same JSON values, written differently (" + describe_text_difference(a, ra, b, rb) + ")";
  std::string out;
  const size_t shown = std::min<size_t>(diffs.size(), 3);
  for (size_t k = 0; k < shown; k++) out += (k ? "; " : "") + diffs[k];
  if (diffs.size() > shown) out += strfmt("; and %zu more", diffs.size() - shown);
  return out;
}

void check_same_across_ranks(Comm& comm, const std::string& text, const std::string& what) {
  const int n = comm.size(), rank = comm.rank();
  if (n == 1) return;
  uint64_t mine = fnv1a64(text);
  std::vector<uint64_t> hashes(static_cast<size_t>(n));
  comm.all_gather(&mine, hashes.data(), 2, DType::i32);  // a 64-bit hash as two i32
  std::vector<int> differ;
  for (int r = 1; r < n; r++)
    if (hashes[size_t(r)] != hashes[0]) differ.push_back(r);
  if (differ.empty()) return;

  // The first differing rank sends its text to rank 0, which names the difference.
  const int first = differ[0];
  if (rank == first || rank == 0) {
    int32_t len = 0;
    std::vector<int32_t> words;
    if (rank == first) {
      MT_CHECK(text.size() < (1u << 30), "%s is too long to compare (%zu bytes)", what.c_str(), text.size());
      len = int32_t(text.size());
      words.resize((text.size() + 3) / 4);
      std::memcpy(words.data(), text.data(), text.size());
      comm.send(&len, 1, DType::i32, 0, 0);
      comm.send(words.data(), words.size(), DType::i32, 0, 1);
    } else {
      comm.recv(&len, 1, DType::i32, first, 0);
      words.resize((size_t(len) + 3) / 4);
      comm.recv(words.data(), words.size(), DType::i32, first, 1);
      std::string other(reinterpret_cast<const char*>(words.data()), size_t(len));
      std::string others =
          differ.size() > 1 ? strfmt(" (and %zu other%s)", differ.size() - 1, differ.size() > 2 ? "s" : "") : "";
      throw CollectiveError(strfmt("%s differs across ranks: rank %d%s disagree%s with rank 0; %s", what.c_str(), first,
                                   others.c_str(), differ.size() > 1 ? "" : "s",
                                   describe_difference(text, 0, other, first).c_str()));
    }
  }
  throw CollectiveError(strfmt("%s differs across ranks (rank 0 reports the difference)", what.c_str()));
}

}  // namespace mt::parallel
