// The sizes minitrain's arithmetic holds. Parameter counts, FLOPs, bytes and message sizes are
// products of the options (n_embd^2 x n_layer, batch x seq_len x grad_accum x dp, ...) computed in
// 64-bit integers and doubles, by the trainer and by the planner alike; past these bounds a product
// could wrap (a model of "-7.34 E parameters", a negative step time). Each is generous: a thousand
// times the largest published training runs, and 2^13 or more short of where the 64-bit arithmetic
// ends (2^63, and doubles count exactly to 2^53), so the factors of 2-64 that bytes, ranks and
// recomputation add on top still fit.
//
//   one option     its largest value (option_limit below: model and moe dimensions, batch, ranks)
//   parameters     num_params() <= 2^50 (1.1e15), and num_params() x grad_accum <= 2^56 (the
//                  gradient bytes ZeRO 2-3 move per step)
//   tokens         batch_size x seq_len x grad_accum x dp (or global_batch x seq_len) <= 2^48 per step
//   activations    tokens per step x n_layer x (n_embd x k + n_head x seq_len) <= 2^54, k = 1 for a
//                  dense model, moe.top_k + moe.shared for a mixture: the activation elements of a
//                  step over all ranks, attention probabilities included (whatever the attention path)
//   ranks          dp x tp x pp x cp <= 2^20 (also `minitrain plan gpus=`)
//
// (A step of Llama 3 405B's pretraining, 16M tokens of 8192 over 126 layers, is 2^51 activation
// elements by this count.)
//
// A value past a bound is refused before anything runs, with one line naming the option (or the
// product) and the bound, by `minitrain train` and `minitrain plan` alike (TrainOptions::validate).
#pragma once
#include <cstdint>
#include <string>

namespace mt::config {

struct TrainOptions;

constexpr int64_t kMaxRanks = int64_t(1) << 20;
constexpr double kMaxParams = double(int64_t(1) << 50);
constexpr double kMaxGradientElementsPerStep = double(int64_t(1) << 56);
constexpr double kMaxActivationElements = double(int64_t(1) << 54);
constexpr double kMaxTokensPerStep = double(int64_t(1) << 48);

// The largest value of the numeric option `key` (its key in TrainOptions::to_json()), or a negative
// number when the option has no bound of this kind (its range, config/options.cpp, is all it needs).
double option_limit(const std::string& key);

// Fails with one line when `key`'s value `x` is beyond option_limit(key).
void check_option_limit(const std::string& key, double x);

// Fails with one line naming the product when the resolved options are beyond a bound above (computed
// in doubles, so the check itself cannot wrap). Needs each option within its own limit.
void check_size_limits(const TrainOptions& o);

}  // namespace mt::config
