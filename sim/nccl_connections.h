// The NCCL stand-in's model of NCCL's lazy connections, for tests (sim/nccl_bootstrap.cpp defines it).
//
// NCCL sets up a communicator's connections on first use and allocates their buffers then, on the
// device and outside the CUDA memory pool: the collectives' ring (and tree) on the first collective,
// and a point-to-point connection to a peer on the first send or receive with it. A run that first
// uses one after the pool has grown to its peak can find the device full ("unhandled cuda error").
// The stand-in records the same events per communicator of two or more ranks: `ring` by its first
// all-reduce, reduce-scatter, all-gather or broadcast, a peer by its first send or receive with it
// (either direction). It allocates nothing; `bytes` is the estimate the planner counts
// (plan/memory.h plan_nccl_bytes, the same defaults): each connection kNcclChannels channels of
// kNcclBuffSize bytes. A communicator stops counting once destroyed or aborted (NCCL frees them then).
#pragma once
#include <cstdint>

namespace mt::sim::nccl {

constexpr uint64_t kNcclBuffSize = uint64_t(4) << 20;  // NCCL_BUFFSIZE's default
constexpr int kNcclChannels = 32;                       // the planner's default channel count

struct Connections {
  int rings = 0;       // communicators whose collectives have connected
  int peers = 0;       // point-to-point connections, summed over communicators
  uint64_t bytes = 0;  // (rings + peers) x kNcclChannels x kNcclBuffSize
  bool operator==(const Connections&) const = default;
};

// Over every communicator of this process not destroyed nor aborted.
Connections connections();

}  // namespace mt::sim::nccl
