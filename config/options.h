// Training options: one struct per concern, parsed in one place (config/options.cpp) from a JSON config
// file plus `key=value` overrides and `--flag value` layout flags. Every error names the key or flag.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/writer_thread.h"
#include "model/config.h"
#include "model/gpt.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace mt::config {

enum class LrSchedule { cosine, linear, constant };

struct OptimOptions {
  float lr = 6e-4f;
  float min_lr_ratio = 0.1f;  // the schedule decays to lr * min_lr_ratio
  int warmup_steps = 10;
  LrSchedule schedule = LrSchedule::cosine;
  float weight_decay = 0.1f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float grad_clip = 1.0f;  // <= 0 disables clipping
};

// Dynamic loss scaling for fp16 (Micikevicius et al. 2018): skip the step and halve the scale on
// inf/NaN gradients, double it after `growth_interval` clean steps. `max_skips` skipped steps in a
// row stop the run as diverged (train/divergence.h).
struct LossScaleOptions {
  float init_scale = 65536.f;
  int growth_interval = 200;
  int max_skips = 20;
};

struct DataOptions {
  std::string path;             // a token shard file or a dataset directory
  std::string val_path;         // optional held-out shards
  std::string mode = "shuffled";  // shuffled | sequential (the loader's default too)
  bool doc_mask = false;        // document-masked attention and per-document positions
  int prefetch = 2;             // batches prepared ahead on a background thread (0: none)
  std::string mix;              // "a:0.7,b:0.3" weighted mixture of datasets (in place of path)
};

// The parallel layout (--dp --tp --pp --cp), ZeRO stage and data-parallel knobs.
struct ParallelOptions {
  int dp = 0;  // 0: inferred from the world size
  int tp = 1, pp = 1, cp = 1;
  int ep = 1;  // expert parallelism: each rank of an ep group holds moe.experts / ep experts (from dp x cp)
  int sp = -1;                // tp.sp: sequence parallelism (-1: on when tp > 1; 1 with tp = 1 is an error)
  int zero = 0;               // ZeRO stage 0..3
  double bucket_mb = 4;       // gradient bytes per all-reduce bucket (stages 0-1), in MiB
  bool embedding_rows = true; // ZeRO 0-2 on the CPU: reduce the embeddings' sparse gradient as rows
  int sdc_every = 0;          // steps between cross-replica parameter hash checks (0: never)
  int sdc_flip_step = -1;     // fault injection: before this step's check, flip one bit ...
  int sdc_flip_rank = 0;      // ... in the parameters of this world rank
  // Pipeline parallelism (train/pipeline.h): the schedule, model chunks per rank, layers per stage.
  std::string pp_schedule = "1f1b";  // pp.schedule: gpipe | 1f1b | interleaved | zb1
  int pp_virtual = 1;                // pp.virtual: chunks per pipeline rank (interleaved: 2 or more)
  std::string pp_layers;             // pp.layers=3,3,2,4: each stage's layers ("": even)
  // pp.exchange: how the executor issues messages (parallel/pipeline_executor.h): auto (paired on
  // cuda, ahead on the CPU) | ahead | paired.
  std::string pp_exchange = "auto";
};

// Checkpoints (checkpoint/): where, how many, async or not, and fault injection for recovery tests.
struct CheckpointOptions {
  std::string dir;         // default: <out_dir>/checkpoints
  int keep = 3;            // newest checkpoints kept
  bool async = true;
  // The background writer's scheduling priority (checkpoint/writer_thread.h): idle gives the cores
  // to training first; normal competes with it.
  checkpoint::WriterPriority writer_priority = checkpoint::WriterPriority::idle;
  bool sync_fallback = true;  // async saves turn synchronous when they keep waiting (checkpointer.h)
  // Fault injection: SIGKILL world rank `fault_rank` at phase `fault_phase` of step `fault_step`
  // (forward, backward, optimizer, staging, write, before_commit, after_commit) or make its
  // checkpoint write fail (enospc; fault_rank -1: every rank's) or stall (slow_write), or stop it
  // (hang: SIGSTOP before the step) or slow it down (straggler: a sleep before every step from
  // fault_step on; train/stragglers.h). Armed once per out_dir: a relaunched run does not fire it again.
  std::string fault_phase;
  int fault_step = -1;
  int fault_rank = 0;
};

// Waits on peers and stragglers (parallel/comm.h WaitPolicy, train/stragglers.h).
struct DistOptions {
  double timeout = 600;         // dist.timeout: seconds a wait on peers may last before the job ends as hung (4)
  double straggler_ratio = 1.5; // dist.straggler_ratio: a rank busier than this x the median (and by 50 ms) is named (0: off)
};

struct TrainOptions {
  std::string model_preset = "tiny";
  model::GPTConfig model = model::GPTConfig::preset("tiny");
  DataOptions data;
  ParallelOptions parallel;
  OptimOptions optim;
  LossScaleOptions loss_scale;
  CheckpointOptions ckpt;
  DistOptions dist;
  int batch_size = 4;   // B: rows per micro-batch (per data-parallel rank)
  int global_batch = 0; // if > 0: rows per optimizer step over all ranks; sets B = global / (dp x accum)
  int seq_len = 64;     // T
  int grad_accum = 1;   // micro-batches per optimizer step
  int steps = 50;
  uint64_t seed = 1337;
  DType precision = DType::f32;
  model::Recompute recompute = model::Recompute::none;
  std::string attention = "auto";  // materialized | flash | auto (flash on cuda, materialized on cpu)
  Device device = Device::cpu;
  std::string out_dir = "runs/default";
  std::string init_from;   // Hugging Face GPT-2 safetensors to initialise the weights from
  std::string resume;      // "auto": newest valid checkpoint in ckpt.dir (fresh start if there is no
                           // checkpoint; an error if there are some but none verifies); "fresh": step 0
                           // even in a run directory with checkpoints; a checkpoint directory (step_N/)
                           // or a checkpoint root; "": fresh start in a new out_dir; "own": this
                           // run's (run_id's) newest valid checkpoint, step 0 when it has none yet
  int save_every = 0;      // steps between checkpoints (0: only at the end)
  int eval_every = 0;      // steps between validation evaluations (0: never)
  int eval_batches = 4;
  int log_every = 1;
  int threads = 0;         // OpenMP threads (0: all cores)
  double peak_flops = 0;   // override of the peak used for MFU (0: calibrate / table)
  bool profile_ops = false; // time every op (kernels/op_timer.h); `minitrain bench` prints the table
  // The run's identity, in its checkpoints' metadata and its lock file: "" draws one for a new run
  // (a resumed run keeps its checkpoint's). resume=auto and resume=own look for this run's checkpoints
  // first (scripts/supervise passes one to every attempt of a job).
  std::string run_id;
  // Preemption (runtime/preempt.h): seconds a SIGTERM/SIGUSR1 leaves the ranks to reach a step
  // boundary and save before the process ends anyway (0: no deadline).
  int preempt_deadline = 120;
  // Refuse a run whose planned peak per rank exceeds the memory each rank can have (train/preflight.h).
  bool mem_check = true;
  // mem.poison: fill every reused host activation block with NaN bytes before it is handed out, as new
  // blocks are, so that a kernel reading a buffer before writing it shows in the loss (a debugging aid;
  // off, reused blocks keep their last contents and the step saves a pass over its activations).
  bool mem_poison = false;
  struct Trace {
    bool on = false;  // trace=1: a Chrome trace per rank under <out_dir>/trace/ (runtime/trace.h)
    int start = 2;    // the first traced step (the first step warms up)
    int steps = 3;    // how many steps are traced
  } trace;

  nlohmann::json to_json() const;
  void validate() const;
  bool sequence_parallel() const { return parallel.tp > 1 && parallel.sp != 0; }
  model::Attention attention_kind() const;  // `attention` with auto resolved for `device`
};

// Parses `args` (the arguments after `minitrain train`): `--config file.json`, `key=value`
// overrides with dotted keys (optim.lr=3e-4, model.n_layer=2, data.path=...), and `--flag value`
// forms for common keys (--steps, --precision, --recompute, --device, --out ...).
TrainOptions parse_train_options(const std::vector<std::string>& args);

// Strict conversions of option values, each failing with a message naming `key` (also used for the
// flags of `bench` and `sample`).
int parse_int(const std::string& key, const std::string& value);
uint64_t parse_u64(const std::string& key, const std::string& value);
double parse_number(const std::string& key, const std::string& value);

// What the help says of one option of the parser's table (cli/help.h renders it).
struct OptionDoc {
  std::string key, group, meaning;
};
std::vector<OptionDoc> option_docs();  // every key apply_option() takes, in table order

// Applies one `key=value` (dotted key) to `o`; throws naming the key on an unknown key or bad value.
void apply_option(TrainOptions& o, const std::string& key, const std::string& value);

}  // namespace mt::config
