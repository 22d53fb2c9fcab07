// Options that only mean something when another option is set: given without it, each is refused
// with one line naming it and what it needs, rather than ignored (a run the user did not ask for).
//
//   moe.top_k, moe.every, moe.capacity, moe.balance, moe.aux_coef, moe.z_coef, moe.bias_rate,
//   moe.shared                      need a mixture of experts (moe.experts > 0)
//   trace.start, trace.steps        need trace=1
//   loss_scale.init,
//   loss_scale.growth_interval      need precision=fp16 (the only precision that scales its loss)
//
// Only options typed on the command line count (a key=value or a --flag; a --config file may hold
// every key, as a run's config.json does): a preset's, a default's or a file's values are never refused.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace mt::config {

struct TrainOptions;

// Fails with one line for the first of `given` (key and value, the key as the parser's table names it)
// that `o`, the resolved options, would ignore.
void check_no_ignored_options(const TrainOptions& o, const std::vector<std::pair<std::string, std::string>>& given);

}  // namespace mt::config
