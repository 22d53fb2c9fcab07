#include "config/options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>

#include "checkpoint/checkpointer.h"
#include "config/layout_rules.h"
#include "config/ignored_options.h"
#include "config/limits.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/ring_attention.h"
#include "runtime/check.h"

namespace mt::config {

namespace {

bool to_bool(const std::string& key, const std::string& v) {
  if (v == "1" || v == "true" || v == "on") return true;
  if (v == "0" || v == "false" || v == "off") return false;
  fail("%s must be true or false (got '%s')", key.c_str(), v.c_str());
}

LrSchedule schedule_from_name(const std::string& v) {
  if (v == "cosine") return LrSchedule::cosine;
  if (v == "linear") return LrSchedule::linear;
  if (v == "constant") return LrSchedule::constant;
  fail("optim.schedule must be cosine, linear or constant (got '%s')", v.c_str());
}

const char* schedule_name(LrSchedule s) {
  return s == LrSchedule::cosine ? "cosine" : s == LrSchedule::linear ? "linear" : "constant";
}

using Setter = std::function<void(TrainOptions&, const std::string& key, const std::string& v)>;

// One option: its key, how it is applied, and what `minitrain train --help` says of it (its group and
// a one-line meaning; its type and default come from TrainOptions{}.to_json()).
struct OptionEntry {
  const char* key;
  Setter set;
  const char* group = "";
  const char* meaning = "";
};

// The parser's table, in the order the help lists it (within each group).
const std::vector<OptionEntry>& option_table() {
  static const std::vector<OptionEntry> table = {
      {"model", [](TrainOptions& o, auto&, auto& v) { o.model_preset = v; o.model = model::GPTConfig::preset(v); }, "model", "preset: tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl, tiny-moe, gpt2-moe (dimensions and moe.* below override it)"},
      {"model.preset", [](TrainOptions& o, auto&, auto& v) { o.model_preset = v; o.model = model::GPTConfig::preset(v); }, "model", "same as model"},
      {"model.vocab_size", [](TrainOptions& o, auto& k, auto& v) { o.model.vocab_size = parse_int(k, v); }, "model", "vocabulary size (token ids the embedding holds)"},
      {"model.block_size", [](TrainOptions& o, auto& k, auto& v) { o.model.block_size = parse_int(k, v); }, "model", "longest context the model has positions for"},
      {"model.n_layer", [](TrainOptions& o, auto& k, auto& v) { o.model.n_layer = parse_int(k, v); }, "model", "transformer blocks"},
      {"model.n_head", [](TrainOptions& o, auto& k, auto& v) { o.model.n_head = parse_int(k, v); }, "model", "attention heads per block"},
      {"model.n_embd", [](TrainOptions& o, auto& k, auto& v) { o.model.n_embd = parse_int(k, v); }, "model", "width of the residual stream"},
      {"moe.experts", [](TrainOptions& o, auto& k, auto& v) { o.model.moe.experts = parse_int(k, v); }, "moe", "experts per mixture layer (0: a dense model)"},
      {"moe.top_k", [](TrainOptions& o, auto& k, auto& v) { o.model.moe.top_k = parse_int(k, v); }, "moe", "experts each token is routed to"},
      {"moe.every", [](TrainOptions& o, auto& k, auto& v) { o.model.moe.every = parse_int(k, v); }, "moe", "every N-th layer's MLP is a mixture (layers N-1, 2N-1, ...), the others dense"},
      {"moe.capacity", [](TrainOptions& o, auto& k, auto& v) { o.model.moe.capacity = parse_number(k, v); }, "moe", "capacity factor: an expert takes at most ceil(F x tokens x top_k / experts) (0: dropless)"},
      {"moe.balance", [](TrainOptions& o, auto&, auto& v) { o.model.moe.balance = model::moe_balance_from_name(v); }, "moe", "load balancing: aux (Switch loss) | bias (aux-loss-free routing bias) | none"},
      {"moe.aux_coef", [](TrainOptions& o, auto& k, auto& v) { o.model.moe.aux_coef = parse_number(k, v); }, "moe", "alpha of the load-balancing loss alpha E sum f_i P_i (balance=aux)"},
      {"moe.z_coef", [](TrainOptions& o, auto& k, auto& v) { o.model.moe.z_coef = parse_number(k, v); }, "moe", "weight of the router z-loss, mean logsumexp(logits)^2"},
      {"moe.bias_rate", [](TrainOptions& o, auto& k, auto& v) { o.model.moe.bias_rate = parse_number(k, v); }, "moe", "gamma of the routing-bias update after each step (balance=bias)"},
      {"moe.shared", [](TrainOptions& o, auto& k, auto& v) { o.model.moe.shared = parse_int(k, v); }, "moe", "shared experts every token of a mixture layer uses"},
      {"data.path", [](TrainOptions& o, auto&, auto& v) { o.data.path = v; }, "data", "a token shard file or a dataset directory; 'synthetic' for random tokens (--data)"},
      {"data.val_path", [](TrainOptions& o, auto&, auto& v) { o.data.val_path = v; }, "data", "held-out shards for validation (eval_every)"},
      {"data.mode", [](TrainOptions& o, auto& k, auto& v) {
         if (v != "sequential" && v != "shuffled") fail("%s must be sequential or shuffled (got '%s')", k.c_str(), v.c_str());
         o.data.mode = v; }, "data", "shuffled | sequential order of training windows"},
      {"data.doc_mask", [](TrainOptions& o, auto& k, auto& v) { o.data.doc_mask = to_bool(k, v); }, "data", "document-masked attention and per-document positions"},
      {"data.prefetch", [](TrainOptions& o, auto& k, auto& v) { o.data.prefetch = parse_int(k, v); }, "data", "batches prepared ahead on a background thread (0: none)"},
      {"data.mix", [](TrainOptions& o, auto&, auto& v) { o.data.mix = v; }, "data", "weighted mixture of datasets, a:0.7,b:0.3 (in place of data.path)"},
      {"optim.lr", [](TrainOptions& o, auto& k, auto& v) { o.optim.lr = float(parse_number(k, v)); }, "optimizer", "peak learning rate of AdamW"},
      {"optim.min_lr_ratio", [](TrainOptions& o, auto& k, auto& v) { o.optim.min_lr_ratio = float(parse_number(k, v)); }, "optimizer", "the schedule decays to lr x min_lr_ratio"},
      {"optim.warmup_steps", [](TrainOptions& o, auto& k, auto& v) { o.optim.warmup_steps = parse_int(k, v); }, "optimizer", "steps of linear warmup"},
      {"optim.schedule", [](TrainOptions& o, auto&, auto& v) { o.optim.schedule = schedule_from_name(v); }, "optimizer", "cosine | linear | constant decay after warmup"},
      {"optim.weight_decay", [](TrainOptions& o, auto& k, auto& v) { o.optim.weight_decay = float(parse_number(k, v)); }, "optimizer", "AdamW decoupled weight decay (matrices only)"},
      {"optim.beta1", [](TrainOptions& o, auto& k, auto& v) { o.optim.beta1 = float(parse_number(k, v)); }, "optimizer", "AdamW first-moment decay"},
      {"optim.beta2", [](TrainOptions& o, auto& k, auto& v) { o.optim.beta2 = float(parse_number(k, v)); }, "optimizer", "AdamW second-moment decay"},
      {"optim.eps", [](TrainOptions& o, auto& k, auto& v) { o.optim.eps = float(parse_number(k, v)); }, "optimizer", "AdamW epsilon"},
      {"optim.grad_clip", [](TrainOptions& o, auto& k, auto& v) { o.optim.grad_clip = float(parse_number(k, v)); }, "optimizer", "global gradient-norm clip (<= 0: no clipping)"},
      {"ckpt.dir", [](TrainOptions& o, auto&, auto& v) { o.ckpt.dir = v; }, "checkpoint", "checkpoint root ('': <out_dir>/checkpoints)"},
      {"ckpt.keep", [](TrainOptions& o, auto& k, auto& v) { o.ckpt.keep = parse_int(k, v); }, "checkpoint", "newest checkpoints kept (0: keep all)"},
      {"ckpt.async", [](TrainOptions& o, auto& k, auto& v) { o.ckpt.async = to_bool(k, v); }, "checkpoint", "write checkpoints on a background thread"},
      {"ckpt.writer_priority", [](TrainOptions& o, auto& k, auto& v) {
         o.ckpt.writer_priority = checkpoint::writer_priority_from_name(v, k.c_str()); }, "checkpoint", "background writer's CPU priority: idle | normal"},
      {"ckpt.sync_fallback", [](TrainOptions& o, auto& k, auto& v) { o.ckpt.sync_fallback = to_bool(k, v); }, "checkpoint",
       "write synchronously once async saves keep waiting for the previous write"},
      {"ckpt.fault_phase", [](TrainOptions& o, auto&, auto& v) { o.ckpt.fault_phase = v; }, "testing", "fault injection: phase at which to kill ckpt.fault_rank (or enospc: its checkpoint write fails with ENOSPC; slow_write: its write stalls 10 s halfway; hang: SIGSTOP it; straggler: it sleeps 100 ms before every step from ckpt.fault_step; preempt: it sends itself SIGTERM)"},
      {"ckpt.fault_step", [](TrainOptions& o, auto& k, auto& v) { o.ckpt.fault_step = parse_int(k, v); }, "testing", "fault injection: the step of the fault (-1: none)"},
      {"ckpt.fault_rank", [](TrainOptions& o, auto& k, auto& v) { o.ckpt.fault_rank = parse_int(k, v); }, "testing", "fault injection: the world rank that fails (-1 with enospc: every rank, as when one disk fills up)"},
      {"dist.timeout", [](TrainOptions& o, auto& k, auto& v) { o.dist.timeout = parse_number(k, v); }, "parallel",
       "seconds a wait on peers (a collective, a message, a device barrier, a host wait on the device behind them) may last before every waiting rank names it, writes <out_dir>/flight_recorder.rank<R>.jsonl and the job exits 4 (hung)"},
      {"dist.straggler_ratio", [](TrainOptions& o, auto& k, auto& v) { o.dist.straggler_ratio = parse_number(k, v); }, "parallel",
       "a rank whose step busy time (waits on peers excluded) exceeds this x the median, and the median by 50 ms, is named a straggler in the progress line and metrics.jsonl (0: off)"},
      {"loss_scale.init", [](TrainOptions& o, auto& k, auto& v) { o.loss_scale.init_scale = float(parse_number(k, v)); }, "precision", "fp16: initial dynamic loss scale"},
      {"loss_scale.growth_interval", [](TrainOptions& o, auto& k, auto& v) { o.loss_scale.growth_interval = parse_int(k, v); }, "precision", "fp16: clean steps before the scale doubles"},
      {"loss_scale.max_skips", [](TrainOptions& o, auto& k, auto& v) { o.loss_scale.max_skips = parse_int(k, v); }, "precision", "skipped steps in a row that stop the run as diverged"},
      {"parallel.dp", [](TrainOptions& o, auto& k, auto& v) { o.parallel.dp = parse_int(k, v); }, "parallel", "data-parallel ranks (0: world size / (tp x pp x cp)); also dp=, --dp"},
      {"parallel.tp", [](TrainOptions& o, auto& k, auto& v) { o.parallel.tp = parse_int(k, v); }, "parallel", "tensor-parallel ranks; also tp=, --tp"},
      {"parallel.pp", [](TrainOptions& o, auto& k, auto& v) { o.parallel.pp = parse_int(k, v); }, "parallel", "pipeline stages; also pp=, --pp"},
      {"parallel.ep", [](TrainOptions& o, auto& k, auto& v) { o.parallel.ep = parse_int(k, v); }, "parallel", "expert-parallel ranks, carved from dp x cp: each holds moe.experts / ep experts of every mixture layer and the tokens travel to them by all-to-all; also ep=, --ep"},
      {"parallel.cp", [](TrainOptions& o, auto& k, auto& v) { o.parallel.cp = parse_int(k, v); }, "parallel", "context-parallel ranks: ring attention over zigzag chunks of each sequence (seq_len % 2 cp == 0; attention=flash; on a GPU the blocks travel over NCCL); also cp=, --cp"},
      {"parallel.sp", [](TrainOptions& o, auto& k, auto& v) { o.parallel.sp = v == "auto" ? -1 : int(to_bool(k, v)); }, "parallel", "sequence parallelism with tp: auto | true | false"},
      {"tp.sp", [](TrainOptions& o, auto& k, auto& v) { o.parallel.sp = v == "auto" ? -1 : int(to_bool(k, v)); }, "parallel", "same as parallel.sp"},
      {"parallel.zero", [](TrainOptions& o, auto& k, auto& v) { o.parallel.zero = parse_int(k, v); }, "parallel", "ZeRO stage 0-3 (shard optimizer, gradients, parameters); also zero="},
      {"parallel.embedding_rows", [](TrainOptions& o, auto& k, auto& v) { o.parallel.embedding_rows = to_bool(k, v); }, "parallel", "CPU, ZeRO 0-2: reduce the embedding gradient as sparse rows"},
      {"parallel.bucket_mb", [](TrainOptions& o, auto& k, auto& v) { o.parallel.bucket_mb = parse_number(k, v); }, "parallel", "gradient MiB per all-reduce bucket"},
      {"parallel.sdc_every", [](TrainOptions& o, auto& k, auto& v) { o.parallel.sdc_every = parse_int(k, v); }, "parallel", "steps between cross-replica parameter hash checks (0: never)"},
      {"parallel.sdc_flip_step", [](TrainOptions& o, auto& k, auto& v) { o.parallel.sdc_flip_step = parse_int(k, v); }, "testing", "fault injection: flip a parameter bit before this step's check (-1: never)"},
      {"parallel.sdc_flip_rank", [](TrainOptions& o, auto& k, auto& v) { o.parallel.sdc_flip_rank = parse_int(k, v); }, "testing", "fault injection: the world rank whose bit flips"},
      {"pp.schedule", [](TrainOptions& o, auto&, auto& v) {
         parallel::parse_schedule_kind(v);  // fails naming pp.schedule
         o.parallel.pp_schedule = v; }, "parallel", "pipeline schedule: gpipe | 1f1b | interleaved | zb1"},
      {"pp.virtual", [](TrainOptions& o, auto& k, auto& v) { o.parallel.pp_virtual = parse_int(k, v); }, "parallel", "model chunks per pipeline rank (interleaved: 2 or more)"},
      {"pp.layers", [](TrainOptions& o, auto&, auto& v) { o.parallel.pp_layers = v; }, "parallel", "layers per stage, e.g. 3,3,2,4 ('': balanced by FLOPs, the classifier counted; even under interleaved)"},
      {"pp.exchange", [](TrainOptions& o, auto&, auto& v) {
         if (v != "auto" && v != "ahead" && v != "paired") fail("pp.exchange=%s: expected auto, ahead or paired", v.c_str());
         o.parallel.pp_exchange = v; }, "parallel", "pipeline messages: ahead (receives posted one compute action early; host) | paired (one send+receive exchange per compute action; what NCCL needs) | auto (paired on cuda)"},
      {"batch_size", [](TrainOptions& o, auto& k, auto& v) { o.batch_size = parse_int(k, v); }, "batch", "rows per micro-batch per data-parallel rank (B)"},
      {"global_batch", [](TrainOptions& o, auto& k, auto& v) { o.global_batch = parse_int(k, v); }, "batch", "rows per optimizer step over all ranks (0: B x dp x grad_accum)"},
      {"seq_len", [](TrainOptions& o, auto& k, auto& v) { o.seq_len = parse_int(k, v); }, "batch", "tokens per row (T), at most model.block_size"},
      {"grad_accum", [](TrainOptions& o, auto& k, auto& v) { o.grad_accum = parse_int(k, v); }, "batch", "micro-batches per optimizer step"},
      {"steps", [](TrainOptions& o, auto& k, auto& v) { o.steps = parse_int(k, v); }, "run", "optimizer steps to train to"},
      {"seed", [](TrainOptions& o, auto& k, auto& v) { o.seed = parse_u64(k, v); }, "run", "seed of initialisation and data order"},
      {"precision", [](TrainOptions& o, auto& k, auto& v) {
         if (v != "fp32" && v != "bf16" && v != "fp16") fail("%s must be fp32, bf16 or fp16 (got '%s')", k.c_str(), v.c_str());
         o.precision = dtype_from_name(v); }, "precision", "fp32 | bf16 | fp16 compute (fp32 master weights)"},
      {"recompute", [](TrainOptions& o, auto&, auto& v) { o.recompute = model::recompute_from_name(v); }, "precision", "activation checkpointing: none | selective | full"},
      {"attention", [](TrainOptions& o, auto&, auto& v) {
         if (v != "auto") model::attention_from_name(v);  // fails naming --attention
         o.attention = v; }, "precision", "auto | materialized | flash (auto: flash on cuda)"},
      {"device", [](TrainOptions& o, auto&, auto& v) { o.device = device_from_name(v); }, "run", "cpu | cuda"},
      {"out_dir", [](TrainOptions& o, auto&, auto& v) { o.out_dir = v; }, "logging", "run directory: metrics.jsonl, config.json, checkpoints, model.safetensors (--out)"},
      {"init_from", [](TrainOptions& o, auto&, auto& v) { o.init_from = v; }, "checkpoint", "Hugging Face GPT-2 safetensors to initialise the weights from"},
      {"resume", [](TrainOptions& o, auto&, auto& v) { o.resume = v; }, "checkpoint", "auto | fresh | own | a checkpoint or root ('': new run; own: run_id's newest, else step 0)"},
      {"run_id", [](TrainOptions& o, auto& k, auto& v) {
         if (v.size() > 64 || v.find_first_not_of("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_.") != std::string::npos)
           fail("%s=%s: expected at most 64 letters, digits, '-', '_' or '.'", k.c_str(), v.c_str());
         o.run_id = v; }, "checkpoint", "the run's identity in its checkpoints and lock ('': drawn by a new run, kept by a resumed one); resume=auto/own prefer its checkpoints"},
      {"preempt.deadline", [](TrainOptions& o, auto& k, auto& v) { o.preempt_deadline = parse_int(k, v); }, "run",
       "seconds after SIGTERM/SIGUSR1 to reach a step boundary and save before exiting anyway (0: none)"},
      {"mem.check", [](TrainOptions& o, auto& k, auto& v) { o.mem_check = to_bool(k, v); }, "run",
       "refuse a run whose planned peak per rank exceeds the memory available to each rank"},
      {"mem.poison", [](TrainOptions& o, auto& k, auto& v) { o.mem_poison = to_bool(k, v); }, "run",
       "CPU: fill every reused activation block with NaN, as new ones are, to expose a read before a write (slower)"},
      {"save_every", [](TrainOptions& o, auto& k, auto& v) { o.save_every = parse_int(k, v); }, "checkpoint", "steps between checkpoints (0: only at the end)"},
      {"eval_every", [](TrainOptions& o, auto& k, auto& v) { o.eval_every = parse_int(k, v); }, "logging", "steps between validation evaluations (0: never)"},
      {"eval_batches", [](TrainOptions& o, auto& k, auto& v) { o.eval_batches = parse_int(k, v); }, "logging", "validation batches per evaluation"},
      {"log_every", [](TrainOptions& o, auto& k, auto& v) { o.log_every = parse_int(k, v); }, "logging", "steps between progress lines"},
      {"threads", [](TrainOptions& o, auto& k, auto& v) { o.threads = parse_int(k, v); }, "run", "OpenMP threads (0: all cores)"},
      {"peak_flops", [](TrainOptions& o, auto& k, auto& v) { o.peak_flops = parse_number(k, v); }, "logging", "peak FLOP/s per rank for MFU (0: calibrate or datasheet)"},
      {"profile_ops", [](TrainOptions& o, auto& k, auto& v) { o.profile_ops = to_bool(k, v); }, "logging", "time every op (bench prints the table)"},
      {"trace", [](TrainOptions& o, auto& k, auto& v) { o.trace.on = to_bool(k, v); }, "logging", "write a Chrome trace (Perfetto) per rank of ops, communication and pipeline actions to <out_dir>/trace/"},
      {"trace.on", [](TrainOptions& o, auto& k, auto& v) { o.trace.on = to_bool(k, v); }, "logging", "same as trace"},
      {"trace.start", [](TrainOptions& o, auto& k, auto& v) { o.trace.start = parse_int(k, v); }, "logging", "the first traced step"},
      {"trace.steps", [](TrainOptions& o, auto& k, auto& v) { o.trace.steps = parse_int(k, v); }, "logging", "how many steps the trace covers"},
  };
  return table;
}

const std::map<std::string, const OptionEntry*>& setters() {
  static const std::map<std::string, const OptionEntry*> by_key = [] {
    std::map<std::string, const OptionEntry*> m;
    for (const OptionEntry& e : option_table()) MT_CHECK(m.emplace(e.key, &e).second, "option '%s' twice", e.key);
    return m;
  }();
  return by_key;
}

// The range of every numeric option, by its key in to_json() (the key a user gives). validate() holds
// the resolved options to it whatever set them (key=value, --config, code); a floating-point option
// must also be finite. A numeric option missing here fails validate() (a bug, caught by the tests).
struct Range {
  double lo, hi;
  bool lo_open, hi_open;
};
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Range kPositive{0, kInf, true, false}, kNonNegative{0, kInf, false, false}, kAny{-kInf, kInf, false, false};
constexpr Range kFrom(double lo) { return {lo, kInf, false, false}; }

const std::map<std::string, Range>& numeric_ranges() {
  static const std::map<std::string, Range> table = {
      {"model.vocab_size", kPositive}, {"model.block_size", kPositive}, {"model.n_layer", kPositive},
      {"model.n_head", kPositive}, {"model.n_embd", kPositive},
      {"moe.experts", kNonNegative}, {"moe.top_k", kPositive}, {"moe.every", kPositive}, {"moe.capacity", kNonNegative},
      {"moe.aux_coef", kNonNegative}, {"moe.z_coef", kNonNegative}, {"moe.bias_rate", kNonNegative},
      {"moe.shared", kNonNegative},
      {"data.prefetch", kNonNegative}, {"trace.start", kPositive}, {"trace.steps", kPositive},
      {"optim.lr", kNonNegative}, {"optim.min_lr_ratio", {0, 1, false, false}}, {"optim.warmup_steps", kNonNegative},
      {"optim.weight_decay", kNonNegative}, {"optim.beta1", {0, 1, false, true}}, {"optim.beta2", {0, 1, false, true}},
      {"optim.eps", kPositive}, {"optim.grad_clip", kAny},  // grad_clip <= 0 disables clipping
      {"parallel.dp", kNonNegative}, {"parallel.tp", kPositive}, {"parallel.pp", kPositive}, {"parallel.cp", kPositive}, {"parallel.ep", kPositive},
      {"parallel.zero", {0, 3, false, false}}, {"parallel.bucket_mb", kPositive}, {"parallel.sdc_every", kNonNegative},
      {"parallel.sdc_flip_step", kFrom(-1)}, {"parallel.sdc_flip_rank", kNonNegative}, {"pp.virtual", kPositive},
      {"ckpt.keep", kNonNegative}, {"ckpt.fault_step", kFrom(-1)}, {"ckpt.fault_rank", kFrom(-1)},
      {"dist.timeout", kPositive}, {"dist.straggler_ratio", kNonNegative},
      {"loss_scale.init", kPositive}, {"loss_scale.growth_interval", kPositive}, {"loss_scale.max_skips", kPositive},
      {"batch_size", kPositive}, {"global_batch", kNonNegative}, {"seq_len", kPositive}, {"grad_accum", kPositive},
      {"steps", kPositive}, {"seed", kNonNegative}, {"save_every", kNonNegative}, {"eval_every", kNonNegative},
      {"eval_batches", kPositive}, {"log_every", kPositive}, {"threads", kNonNegative}, {"peak_flops", kNonNegative},
      {"preempt.deadline", kNonNegative},
  };
  return table;
}

// "must be positive", "must be in [0, 1)", ...
std::string describe(const Range& r) {
  if (r.hi == kInf) {
    if (r.lo == 0) return r.lo_open ? "must be positive" : "must not be negative";
    return strfmt("must be %s %g", r.lo_open ? "greater than" : "at least", r.lo);
  }
  return strfmt("must be in %c%g, %g%c", r.lo_open ? '(' : '[', r.lo, r.hi, r.hi_open ? ')' : ']');
}

// Checks every number in `j` (the resolved options as JSON) against numeric_ranges().
void check_numbers(const nlohmann::json& j, const std::string& prefix) {
  for (auto& [k, v] : j.items()) {
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object()) check_numbers(v, key);
    if (!v.is_number()) continue;
    const double x = v.get<double>();
    if (!std::isfinite(x)) fail("%s must be a finite number (got %g)", key.c_str(), x);
    auto it = numeric_ranges().find(key);
    MT_CHECK(it != numeric_ranges().end(), "numeric option '%s' has no range", key.c_str());
    const Range& r = it->second;
    if (x < r.lo || x > r.hi || (r.lo_open && x == r.lo) || (r.hi_open && x == r.hi))
      fail("%s %s (got %g)", key.c_str(), describe(r).c_str(), x);
    check_option_limit(key, x);  // the largest value the size arithmetic holds (config/limits.h)
  }
}

// Flattens nested JSON objects into dotted keys with string values.
void flatten(const nlohmann::json& j, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  for (auto& [k, v] : j.items()) {
    std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object()) {
      flatten(v, key, out);
    } else if (v.is_string()) {
      out.emplace_back(key, v.get<std::string>());
    } else if (v.is_boolean()) {
      out.emplace_back(key, v.get<bool>() ? "true" : "false");
    } else if (v.is_number()) {
      out.emplace_back(key, v.dump());
    } else {
      fail("config key '%s' has an unsupported value %s", key.c_str(), v.dump().c_str());
    }
  }
}

}  // namespace

std::vector<OptionDoc> option_docs() {
  std::vector<OptionDoc> docs;
  for (const OptionEntry& e : option_table()) docs.push_back({e.key, e.group, e.meaning});
  return docs;
}

int parse_int(const std::string& key, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno || x < INT32_MIN || x > INT32_MAX)
    fail("%s must be an integer (got '%s')", key.c_str(), v.c_str());
  return int(x);
}

uint64_t parse_u64(const std::string& key, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || *end != '\0' || errno)
    fail("%s must be a non-negative integer (got '%s')", key.c_str(), v.c_str());
  return uint64_t(x);
}

double parse_number(const std::string& key, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno) fail("%s must be a number (got '%s')", key.c_str(), v.c_str());
  if (!std::isfinite(x)) fail("%s must be a finite number (got '%s')", key.c_str(), v.c_str());
  return x;
}

void apply_option(TrainOptions& o, const std::string& key, const std::string& value) {
  auto it = setters().find(key);
  if (it == setters().end()) it = setters().find("parallel." + key);  // dp=2, zero=3 ... as short forms
  if (it == setters().end()) fail("unknown option '%s'", key.c_str());
  it->second->set(o, key, value);
}

TrainOptions parse_train_options(const std::vector<std::string>& args) {
  std::vector<std::pair<std::string, std::string>> kv, typed;  // every key; the command line's own
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) == 0) {
      std::string flag = a.substr(2);
      std::string value;
      size_t eq = flag.find('=');
      if (eq != std::string::npos) {
        value = flag.substr(eq + 1);
        flag = flag.substr(0, eq);
      } else {
        if (i + 1 >= args.size()) fail("flag --%s needs a value", flag.c_str());
        value = args[++i];
      }
      for (char& c : flag)
        if (c == '-') c = '_';
      if (flag == "config") {
        std::ifstream f(value);
        if (!f) fail("cannot open config file '%s'", value.c_str());
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(f);
        } catch (const nlohmann::json::exception& e) {
          fail("config file '%s' is not valid JSON: %s", value.c_str(), e.what());
        }
        if (!j.is_object()) fail("config file '%s' must hold a JSON object", value.c_str());
        flatten(j, "", kv);
        continue;
      }
      if (flag == "out") flag = "out_dir";
      if (flag == "data") flag = "data.path";
      if (!setters().count(flag) && setters().count("parallel." + flag)) flag = "parallel." + flag;  // --dp, --zero ...
      if (!setters().count(flag)) fail("unknown flag '--%s'", flag.c_str());
      kv.emplace_back(flag, value);
      typed.push_back(kv.back());
    } else {
      size_t eq = a.find('=');
      if (eq == std::string::npos || eq == 0) fail("unexpected argument '%s' (expected key=value or --flag value)", a.c_str());
      kv.emplace_back(a.substr(0, eq), a.substr(eq + 1));
      typed.push_back(kv.back());
    }
  }
  TrainOptions o;
  // The preset goes first so that explicit dimensions override it whatever their order.
  for (auto& [k, v] : kv)
    if (k == "model" || k == "model.preset") apply_option(o, k, v);
  for (auto& [k, v] : kv)
    if (k != "model" && k != "model.preset") apply_option(o, k, v);
  o.validate();
  // A --config file may hold every key (a run's config.json does): only the typed ones are judged.
  check_no_ignored_options(o, typed);
  return o;
}

void TrainOptions::validate() const {
  check_numbers(to_json(), "");  // every numeric option: finite and in its range
  check_size_limits(*this);      // products of options that the 64-bit arithmetic holds
  model.validate();
  if (model.moe.enabled()) {
    // Both backends run the mixture layers; on a GPU expert parallelism's rows travel over NCCL
    // (train/trainer.cpp builds ep.nccl; a build without NCCL says so when the trainer starts).
    if (model.moe.experts % parallel.ep != 0)
      fail("moe.experts=%d is not divisible by --ep %d: each expert-parallel rank holds the same number of experts",
           model.moe.experts, parallel.ep);
    if (parallel.dp > 0 && (int64_t(parallel.dp) * parallel.cp) % parallel.ep != 0)
      fail("--ep %d does not divide --dp %d x --cp %d = %d: expert parallelism is carved from the data-parallel ranks",
           parallel.ep, parallel.dp, parallel.cp, parallel.dp * parallel.cp);
    // Under --cp a micro-batch's tokens are spread over the cp ranks: the balance term and the drops are
    // decided over all of them (moe/token_group.h), the routing statistics summed over dp x cp.
  }
  if (parallel.ep > 1 && !model.moe.enabled())
    fail("--ep %d needs a mixture of experts (moe.experts > 0, e.g. model=tiny-moe): a dense model has no experts "
         "to split", parallel.ep);
  if (resume == "own" && run_id.empty())
    fail("resume=own resumes this run's own checkpoints: it needs run_id=ID (scripts/supervise passes one)");
  if (seq_len > model.block_size)
    fail("seq_len %d is longer than the model's context (model.block_size = %d)", seq_len, model.block_size);
  if (!data.mix.empty() && !data.path.empty())
    fail("data.path=%s and data.mix=%s are both set: data.mix names every training dataset (drop data.path, or "
         "add it to the mix)", data.path.c_str(), data.mix.c_str());
  if (parallel.cp > 1) {
    // Context parallelism: ring attention (parallel/ring_attention.h) over zigzag chunks of the sequence.
    parallel::Zigzag::check(seq_len, parallel.cp);
    if (attention_kind() != model::Attention::flash)
      fail("--cp %d needs attention=flash (or auto): ring attention merges flash blocks by their log-sum-exp, and "
           "attention=materialized would keep the whole T x T probabilities on every rank", parallel.cp);
  }
  check_pipeline_options(*this);
  if (parallel.tp == 1 && parallel.sp == 1)
    fail("tp.sp=true needs tensor parallelism: sequence parallelism splits the sequence over --tp ranks (got --tp 1)");
  if (parallel.tp > 1) {
    model::GPT::check_tensor_parallel(model, parallel.tp);
    if (sequence_parallel() && (int64_t(batch_size) * seq_len) % parallel.tp != 0 && global_batch == 0)
      fail("tp.sp: the rows of a micro-batch, batch_size %d x seq_len %d, must be divisible by --tp %d (or set "
           "tp.sp=false)", batch_size, seq_len, parallel.tp);
  }
  if (dist.straggler_ratio > 0 && dist.straggler_ratio <= 1)
    fail("dist.straggler_ratio must be 0 (off) or above 1: it is a multiple of the median rank's busy time (got %g)",
         dist.straggler_ratio);
  if (!ckpt.fault_phase.empty() && !checkpoint::is_fault_phase(ckpt.fault_phase))
    fail("ckpt.fault_phase '%s' is not a fault phase (forward, backward, optimizer, staging, write, "
         "before_commit, after_commit, enospc, slow_write, hang, straggler, preempt)", ckpt.fault_phase.c_str());
}

nlohmann::json TrainOptions::to_json() const {
  return {
      {"model", [&] {
         auto m = model.to_json();
         m.erase("moe");  // the mixture's options are keys of their own: moe.*
         m["preset"] = model_preset;
         return m;
       }()},
      {"moe", {{"experts", model.moe.experts}, {"top_k", model.moe.top_k}, {"every", model.moe.every},
               {"capacity", model.moe.capacity}, {"balance", model::moe_balance_name(model.moe.balance)},
               {"aux_coef", model.moe.aux_coef}, {"z_coef", model.moe.z_coef}, {"bias_rate", model.moe.bias_rate},
               {"shared", model.moe.shared}}},
      {"data", {{"path", data.path}, {"val_path", data.val_path}, {"mode", data.mode}, {"doc_mask", data.doc_mask},
                {"prefetch", data.prefetch}, {"mix", data.mix}}},
      {"optim", {{"lr", optim.lr}, {"min_lr_ratio", optim.min_lr_ratio}, {"warmup_steps", optim.warmup_steps},
                 {"schedule", schedule_name(optim.schedule)}, {"weight_decay", optim.weight_decay},
                 {"beta1", optim.beta1}, {"beta2", optim.beta2}, {"eps", optim.eps}, {"grad_clip", optim.grad_clip}}},
      {"parallel", {{"dp", parallel.dp}, {"tp", parallel.tp}, {"pp", parallel.pp}, {"cp", parallel.cp}, {"ep", parallel.ep},
                    {"sp", parallel.sp < 0 ? nlohmann::json("auto") : nlohmann::json(parallel.sp == 1)},
                    {"zero", parallel.zero}, {"bucket_mb", parallel.bucket_mb}, {"embedding_rows", parallel.embedding_rows},
                    {"sdc_every", parallel.sdc_every},
                    {"sdc_flip_step", parallel.sdc_flip_step}, {"sdc_flip_rank", parallel.sdc_flip_rank}}},
      {"pp", {{"schedule", parallel.pp_schedule}, {"virtual", parallel.pp_virtual}, {"layers", parallel.pp_layers},
              {"exchange", parallel.pp_exchange}}},
      {"ckpt", {{"dir", ckpt.dir}, {"keep", ckpt.keep}, {"async", ckpt.async},
                {"writer_priority", checkpoint::writer_priority_name(ckpt.writer_priority)},
                {"sync_fallback", ckpt.sync_fallback}, {"fault_phase", ckpt.fault_phase},
                {"fault_step", ckpt.fault_step}, {"fault_rank", ckpt.fault_rank}}},
      {"dist", {{"timeout", dist.timeout}, {"straggler_ratio", dist.straggler_ratio}}},
      {"loss_scale", {{"init", loss_scale.init_scale}, {"growth_interval", loss_scale.growth_interval},
                      {"max_skips", loss_scale.max_skips}}},
      {"batch_size", batch_size}, {"global_batch", global_batch}, {"seq_len", seq_len}, {"grad_accum", grad_accum}, {"steps", steps},
      {"seed", seed}, {"precision", precision == DType::f32 ? "fp32" : precision == DType::bf16 ? "bf16" : "fp16"},
      {"recompute", model::recompute_name(recompute)}, {"attention", attention}, {"device", device_name(device)}, {"out_dir", out_dir},
      {"init_from", init_from}, {"resume", resume}, {"save_every", save_every}, {"eval_every", eval_every},
      {"eval_batches", eval_batches}, {"log_every", log_every}, {"threads", threads}, {"peak_flops", peak_flops},
      {"profile_ops", profile_ops}, {"run_id", run_id}, {"preempt", {{"deadline", preempt_deadline}}},
      {"mem", {{"check", mem_check}, {"poison", mem_poison}}},
      {"trace", {{"on", trace.on}, {"start", trace.start}, {"steps", trace.steps}}},
  };
}

model::Attention TrainOptions::attention_kind() const {
  // auto: flash on cuda and under context parallelism (ring attention), materialized on the CPU otherwise.
  if (attention == "auto")
    return device == Device::cuda || parallel.cp > 1 ? model::Attention::flash : model::Attention::materialized;
  return model::attention_from_name(attention);
}

}  // namespace mt::config
