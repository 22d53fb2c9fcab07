#include "train/preflight.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "kernels/cuda_available.h"
#include "parallel/mesh.h"
#include "plan/memory.h"
#include "runtime/arena.h"
#include "runtime/check.h"
#include "runtime/exit_status.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace mt::train {

namespace {

// MemAvailable from /proc/meminfo (the kernel's estimate of what can be allocated without swapping),
// else the free pages sysconf reports.
uint64_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string key;
    uint64_t kib = 0;
    if (s >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

}  // namespace

AvailableMemory available_memory(const config::TrainOptions& o, int local_rank, int ranks_here) {
  AvailableMemory a;
  if (o.device == Device::cuda) {
#ifdef MT_HAVE_CUDA
    if (!ops::cuda_unavailable_reason().empty()) return a;  // the trainer says why
    cuda::set_device((local_rank >= 0 ? local_rank : 0) % cuda::device_count());
    const cuda::DeviceMemoryInfo m = cuda::device_memory_info();
    a.bytes = m.total > m.used ? m.total - m.used : 0;
    a.what = strfmt("free on this rank's GPU (%s of %s in use)", format_bytes(m.used).c_str(), format_bytes(m.total).c_str());
#else
    (void)local_rank;
#endif
    return a;
  }
  (void)local_rank;
  const uint64_t host = host_available_bytes();
  const int n = ranks_here > 0 ? ranks_here : 1;
  a.bytes = host / uint64_t(n);
  a.what = n > 1 ? strfmt("the host's MemAvailable %s shared by the %d ranks on this node", format_bytes(host).c_str(), n)
                 : "the host's MemAvailable";
  return a;
}

uint64_t planned_peak(const config::TrainOptions& o, int world_size) {
  try {
    config::TrainOptions p = o;
    const parallel::MeshLayout layout = parallel::resolve_layout(
        parallel::MeshLayout{o.parallel.dp, o.parallel.pp, o.parallel.cp, o.parallel.tp, o.parallel.ep}, world_size);
    if (p.global_batch > 0 && p.global_batch % (layout.dp * p.grad_accum) == 0)
      p.batch_size = p.global_batch / (layout.dp * p.grad_accum);
    return plan::plan_memory_worst(p, layout).total();
  } catch (const Error&) {
    return 0;  // a layout the planner does not model (or one the trainer refuses with its own line)
  }
}

std::string memory_refusal(uint64_t peak, const AvailableMemory& available) {
  if (peak == 0 || available.bytes == 0 || peak <= available.bytes) return "";
  return strfmt("the planned peak memory per rank, %s (minitrain plan with the same options shows it by category), "
                "exceeds the %s each rank can have (%s); shrink the run (batch_size, model, more ranks, ZeRO, "
                "recompute) or give mem.check=off to start it anyway",
                format_bytes(peak).c_str(), format_bytes(available.bytes).c_str(), available.what.c_str());
}

void check_memory_fits(const config::TrainOptions& o, parallel::Comm& world, int local_rank, int ranks_here) {
  if (!o.mem_check) return;
  const std::string why = memory_refusal(planned_peak(o, world.size()), available_memory(o, local_rank, ranks_here));
  int32_t refuse = !why.empty();
  if (world.size() > 1) world.all_reduce(&refuse, 1, DType::i32, parallel::ReduceOp::max);
  if (!refuse) return;
  throw parallel::CollectiveError(why.empty() ? "the planned peak memory exceeds what another rank can have" : why,
                                  kExitRefused);
}

}  // namespace mt::train
