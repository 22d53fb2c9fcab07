// How the background writer shares the machine with training. On a machine whose cores the training
// threads already fill (a CPU run with one thread per core), a writer at normal priority takes cores
// from them in the middle of their parallel regions, and every thread of a region then waits for the
// one that lost its core: steps beside a write ran 4-6x slower on 2 cores (docs/perf.md). At idle
// priority (Linux SCHED_IDLE) the writer runs only on cycles the training leaves unused; a save that
// finds none waits for the next save() or wait(), where the trainer blocks and frees its cores.
// (I/O priority is left alone: it matters only to the BFQ block scheduler, and the writer's cost here
// is CPU: the staging copy, checksums and copies into the page cache.)
#pragma once
#include <string>

namespace mt::checkpoint {

enum class WriterPriority { normal, idle };

// "normal" | "idle" <-> the enum; from_name fails naming `flag` for anything else.
WriterPriority writer_priority_from_name(const std::string& name, const char* flag);
const char* writer_priority_name(WriterPriority p);

// Applies `p` to the calling thread (threads it starts inherit it). Returns "" or why it could not
// (the writer then runs at normal priority; the caller logs it).
std::string set_this_thread_priority(WriterPriority p);

// CPU time consumed by the calling thread so far, in seconds.
double this_thread_cpu_s();

}  // namespace mt::checkpoint
