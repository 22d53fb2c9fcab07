// Running NCCL calls, inside the simulated device's work (sim/nccl.cpp queues them with run_now): the
// agreement before each collective, the collectives' data and reductions, sends and receives. What
// crosses between ranks goes through each communicator's links (MPI, or nothing for one rank; see
// Links in sim/nccl_state.h); everything else here is the same for both.
//
// Numerics (NCCL's, made deterministic): every rank gets the reduction of all ranks' data in rank
// order, x_0 op x_1 op ... op x_{n-1}, computed on every rank from the same bytes, so results are
// bitwise identical across ranks, as NCCL's are. bf16/f16 sums round to the element type after every
// addition, as partial sums do on NCCL's rings (a sum of two 16-bit values computed in fp32 and then
// rounded is the correctly rounded sum: fp32 has more than 2p+1 bits for p = 8 and 11); avg is that
// sum divided by the rank count and rounded; max is exact (a NaN loses to a number, as fmax). int32
// and uint8 sums wrap; their avg truncates.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "sim/nccl_state.h"

namespace mt::sim::nccl {

namespace {

constexpr uint64_t kDescriptorMagic = 0x6e63636c2d646573ull;  // "nccl-des"

Buffer buffer(size_t n) { return std::make_shared<std::vector<unsigned char>>(n); }

// A copy of device bytes (the work runs inside the device's access window).
Buffer copy_of(const void* p, size_t n) {
  Buffer b = buffer(n);
  if (n) std::memcpy(b->data(), p, n);
  return b;
}

// Descriptor fields that must agree, and how a rank's call reads in a message.
bool same_call(const Descriptor& a, const Descriptor& b) {
  return a.magic == b.magic && a.number == b.number && a.count == b.count && a.kind == b.kind && a.type == b.type &&
         a.op == b.op && a.root == b.root;
}

std::string describe(const Descriptor& d) {
  if (d.magic != kDescriptorMagic) return "a malformed descriptor";
  Call c;
  c.kind = Kind(d.kind);
  c.count = size_t(d.count);
  c.type = ncclDataType_t(d.type);
  c.op = ncclRedOp_t(d.op);
  c.root = d.root;
  return describe(c);
}

// --- reductions ------------------------------------------------------------------------------------

struct F32 {
  using T = float;
  static float load(T v) { return v; }
  static T store(float v) { return v; }
};
struct BF16 {
  using T = __nv_bfloat16;
  static float load(T v) { return __bfloat162float(v); }
  static T store(float v) { return __float2bfloat16_rn(v); }
};
struct F16 {
  using T = __half;
  static float load(T v) { return __half2float(v); }
  static T store(float v) { return __float2half_rn(v); }
};

template <class E>
void reduce_float(const unsigned char* in, size_t stride, int n, size_t count, ncclRedOp_t op, unsigned char* out) {
  using T = typename E::T;
  for (size_t i = 0; i < count; i++) {
    auto at = [&](int r) {
      T v;
      std::memcpy(&v, in + size_t(r) * stride + i * sizeof(T), sizeof(T));
      return v;
    };
    T acc = at(0);
    for (int r = 1; r < n; r++) {
      const float a = E::load(acc), v = E::load(at(r));
      if (op != ncclMax) acc = E::store(a + v);  // rounded to the element type at every step
      else if (v > a || (std::isnan(a) && !std::isnan(v))) acc = at(r);
    }
    if (op == ncclAvg) acc = E::store(E::load(acc) / float(n));
    std::memcpy(out + i * sizeof(T), &acc, sizeof(T));
  }
}

template <class T, class Wide>
void reduce_int(const unsigned char* in, size_t stride, int n, size_t count, ncclRedOp_t op, unsigned char* out) {
  for (size_t i = 0; i < count; i++) {
    auto at = [&](int r) {
      T v;
      std::memcpy(&v, in + size_t(r) * stride + i * sizeof(T), sizeof(T));
      return v;
    };
    T acc = at(0);
    for (int r = 1; r < n; r++) {
      const T v = at(r);
      if (op == ncclMax) acc = std::max(acc, v);
      else acc = T(Wide(acc) + Wide(v));  // wraps: the sum is taken in the unsigned type
    }
    if (op == ncclAvg) acc = T(acc / T(n));
    std::memcpy(out + i * sizeof(T), &acc, sizeof(T));
  }
}

// out = in_0 op in_1 op ... op in_{n-1}: `count` elements at in + r * stride.
void reduce(const unsigned char* in, size_t stride, int n, size_t count, ncclDataType_t t, ncclRedOp_t op,
            unsigned char* out) {
  switch (t) {
    case ncclFloat32: return reduce_float<F32>(in, stride, n, count, op, out);
    case ncclBfloat16: return reduce_float<BF16>(in, stride, n, count, op, out);
    case ncclFloat16: return reduce_float<F16>(in, stride, n, count, op, out);
    case ncclInt32: return reduce_int<int32_t, uint32_t>(in, stride, n, count, op, out);
    case ncclUint8: return reduce_int<uint8_t, uint8_t>(in, stride, n, count, op, out);
    default: throw Failure(ncclInternalError, "reduce: datatype " + type_name(t) + " passed the checks");
  }
}

// --- collectives -----------------------------------------------------------------------------------

void run_collective(const Call& call, double timeout) {
  ncclComm& c = *call.comm;
  const std::string ctx = context(call);
  Descriptor mine = descriptor_of(call);
  mine.number = ++c.collectives;
  agree(c, mine, ctx, Deadline(timeout));
  if (call.count == 0) return;
  const Deadline deadline(timeout);
  const int n = c.size;
  const size_t b = call.count * type_size(call.type);  // bytes per rank
  Links& links = *c.links;
  switch (call.kind) {
    case Kind::all_reduce: {
      Buffer mine_bytes = copy_of(call.send, b), all = buffer(size_t(n) * b);
      links.move(c, Move::gather, mine_bytes, all, b, 0, mine.number, deadline, ctx);
      std::vector<unsigned char> out(b);
      reduce(all->data(), b, n, call.count, call.type, call.op, out.data());
      std::memcpy(call.recv, out.data(), b);
      return;
    }
    case Kind::reduce_scatter: {
      // Rank r gets chunk r of every rank's data, and reduces it in rank order.
      Buffer mine_bytes = copy_of(call.send, size_t(n) * b), chunks = buffer(size_t(n) * b);
      links.move(c, Move::exchange, mine_bytes, chunks, b, 0, mine.number, deadline, ctx);
      std::vector<unsigned char> out(b);
      reduce(chunks->data(), b, n, call.count, call.type, call.op, out.data());
      std::memcpy(call.recv, out.data(), b);
      return;
    }
    case Kind::all_gather: {
      Buffer mine_bytes = copy_of(call.send, b), all = buffer(size_t(n) * b);
      links.move(c, Move::gather, mine_bytes, all, b, 0, mine.number, deadline, ctx);
      std::memcpy(call.recv, all->data(), size_t(n) * b);
      return;
    }
    case Kind::broadcast: {
      Buffer bytes = c.rank == call.root ? copy_of(call.send, b) : buffer(b);
      links.move(c, Move::broadcast, bytes, nullptr, b, call.root, mine.number, deadline, ctx);
      std::memcpy(call.recv, bytes->data(), b);
      return;
    }
    default: throw Failure(ncclInternalError, ctx + ": not a collective");
  }
}

// --- sends and receives ----------------------------------------------------------------------------

// A call's or group's messages by communicator, each communicator's in issue order.
using Batches = std::vector<std::pair<ncclComm*, std::vector<Message*>>>;

Batches by_comm(std::vector<Message>& messages) {
  Batches b;
  for (Message& m : messages) {
    ncclComm* c = m.call->comm;
    auto it = std::find_if(b.begin(), b.end(), [&](const auto& e) { return e.first == c; });
    if (it == b.end()) b.push_back({c, {&m}});
    else it->second.push_back(&m);
  }
  return b;
}

// Makes the messages (a send's bytes copied now, in stream order) and posts them on their links.
void post(const std::vector<Call>& calls, std::vector<Message>& m) {
  for (const Call& call : calls) {
    if ((call.kind != Kind::send && call.kind != Kind::recv) || call.count == 0) continue;
    Message x;
    x.call = &call;
    x.bytes = call.count * type_size(call.type);
    x.number = ++call.comm->messages;
    if (call.kind == Kind::send) x.data = copy_of(call.send, x.bytes);
    m.push_back(std::move(x));
  }
  for (auto& [c, mine] : by_comm(m)) c->links->post(mine);
}

// One step on every communicator's links: done when all are, never when any is.
Progress progress(const Batches& batches) {
  Progress all = Progress::done;
  for (const auto& [c, mine] : batches) {
    const Progress p = c->links->progress(mine, c->name);
    if (p == Progress::never) return p;
    if (p == Progress::waiting) all = p;
  }
  return all;
}

// A message in a line: its number, and when the line is a group's, its call and communicator.
std::string message_text(const Message& m, bool grouped) {
  const Call& call = *m.call;
  if (!grouped) return format("message #%llu", (unsigned long long)m.number);
  return format("message #%llu (%s on %s)", (unsigned long long)m.number, describe(call).c_str(),
                call.comm->name.c_str());
}

// What a message that has not completed waits for.
std::string pending(const Message& m, bool grouped) {
  const Call& call = *m.call;
  const std::string peer = ranks_text(*call.comm, {call.root});
  if (call.kind == Kind::send) return message_text(m, grouped) + ": " + peer + " has not received it";
  return message_text(m, grouped) + (m.matched ? ": still arriving from " : ": nothing has arrived from ") + peer;
}

// Waits for every message, then checks each receive got the bytes it posted and delivers it.
void finish(std::vector<Message>& messages, const std::string& head, bool grouped, double timeout) {
  const Deadline deadline(timeout);
  const Batches batches = by_comm(messages);
  for (;;) {
    const Progress p = progress(batches);
    if (p == Progress::done) break;
    if (p == Progress::waiting && !deadline.passed()) {
      pause_between_polls();
      continue;
    }
    std::string waits;
    for (const Message& m : messages)
      if (!m.done) waits += format("%s%s", waits.empty() ? "" : "; ", pending(m, grouped).c_str());
    if (p == Progress::never)
      throw Failure(ncclInvalidUsage, format("%s: %s, and never will: a communicator of one rank sends only to "
                                             "itself, so each send needs its receive in the same group, and each "
                                             "receive its send",
                                             head.c_str(), waits.c_str()));
    throw Failure(ncclSystemError, format("%s: timed out after %g s: %s", head.c_str(), timeout, waits.c_str()));
  }
  std::string wrong;
  for (const Message& m : messages) {
    const Call& call = *m.call;
    if (call.kind != Kind::recv) continue;
    if (size_t(m.arrived) == m.bytes) {
      std::memcpy(call.recv, m.data->data(), m.bytes);
      continue;
    }
    wrong += format("%s%s: %s sent %d bytes, rank %d posted a receive of %zu bytes", wrong.empty() ? "" : "; ",
                    message_text(m, grouped).c_str(), ranks_text(*call.comm, {call.root}).c_str(), m.arrived,
                    call.comm->rank, m.bytes);
  }
  if (!wrong.empty()) throw Failure(ncclInvalidUsage, head + ": " + wrong);
}

}  // namespace

Descriptor descriptor_of(const Call& c) {
  Descriptor d;
  d.magic = kDescriptorMagic;
  d.count = c.count;
  d.kind = int32_t(c.kind);
  d.type = int32_t(c.type);
  d.op = c.kind == Kind::all_reduce || c.kind == Kind::reduce_scatter ? int32_t(c.op) : 0;
  d.root = c.kind == Kind::broadcast ? c.root : 0;
  return d;
}

std::vector<Descriptor> agree(ncclComm& c, const Descriptor& mine, const std::string& ctx, const Deadline& deadline) {
  Descriptor stamped = mine;
  stamped.magic = kDescriptorMagic;
  const std::vector<Descriptor> all = c.links->descriptors(c, stamped, ctx, deadline);
  bool same = true;
  for (const Descriptor& d : all) same = same && same_call(d, stamped);
  if (same) return all;
  // Each distinct call once, with the ranks that made it, in rank order of their first rank.
  std::vector<std::pair<Descriptor, std::vector<int>>> calls;
  bool numbers_differ = false;
  for (int p = 0; p < c.size; p++) {
    const Descriptor& d = all[size_t(p)];
    numbers_differ = numbers_differ || d.number != stamped.number;
    auto it = std::find_if(calls.begin(), calls.end(), [&](const auto& e) { return same_call(e.first, d); });
    if (it == calls.end()) calls.push_back({d, {p}});
    else it->second.push_back(p);
  }
  std::string list;
  for (const auto& [d, ranks] : calls) {
    std::string who;
    for (size_t i = 0; i < ranks.size(); i++) who += format("%s%d", i ? ", " : "", ranks[i]);
    list += format("%s%s%s on rank%s %s", list.empty() ? "" : ", ", describe(d).c_str(),
                   numbers_differ ? format(" (its collective #%llu)", (unsigned long long)d.number).c_str() : "",
                   ranks.size() == 1 ? "" : "s", who.c_str());
  }
  throw Failure(ncclInvalidUsage, format("%s: collective #%llu differs across ranks: %s", ctx.c_str(),
                                         (unsigned long long)stamped.number, list.c_str()));
}

void run_calls(const std::vector<Call>& calls, double timeout) {
  const bool grouped = calls.size() > 1;
  const std::string head = grouped ? format("ncclGroupEnd (%zu calls)", calls.size()) : context(calls[0]);
  std::vector<Message> messages;
  try {
    post(calls, messages);
    for (const Call& call : calls)
      if (call.kind != Kind::send && call.kind != Kind::recv) run_collective(call, timeout);
    finish(messages, head, grouped, timeout);
  } catch (const Failure& f) {
    for (Message& m : messages)
      if (!m.done) m.call->comm->links->abandon(*m.call->comm, m);
    for (const Call& call : calls) {
      if (call.comm->async != ncclSuccess) continue;
      call.comm->async = f.code();
      call.comm->failure = f.what();
    }
    throw;
  }
}

}  // namespace mt::sim::nccl
