// The critical-batch arithmetic (see critical_batch.h).
#include "plan/critical_batch.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/check.h"
#include "runtime/format.h"
#include "runtime/log.h"

namespace mt::plan {

double CriticalBatch::steps_factor_when_doubled() const {
  const double r = noise_tokens / batch_tokens;
  return (1 + r / 2) / (1 + r);
}

double CriticalBatch::tokens_factor_when_doubled() const {
  const double r = batch_tokens / noise_tokens;
  return (1 + 2 * r) / (1 + r);
}

std::string CriticalBatch::note() const {
  const std::string head = strfmt("B_noise ~ %s tokens vs a global batch of %s tokens (%.2g x): ",
                                  format_count(noise_tokens).c_str(), format_count(batch_tokens).c_str(),
                                  batch_tokens / noise_tokens);
  const double s = steps_factor_when_doubled(), e = tokens_factor_when_doubled();
  if (below())
    return head + strfmt("below the critical batch; doubling the batch (2x the dp ranks) would take %.2f x the steps "
                         "for %.2f x the tokens: adding data-parallel ranks still pays", s, e);
  return head + strfmt("above the critical batch; doubling the batch would take %.2f x the steps for %.2f x the "
                       "tokens: more data-parallel ranks mostly spend tokens, so grow the model's share per rank "
                       "(tp, pp, cp) or train longer instead", s, e);
}

double logged_noise_scale(const std::string& path) {
  const std::string file = std::filesystem::is_directory(path) ? (std::filesystem::path(path) / "metrics.jsonl").string()
                                                               : path;
  std::ifstream in(file);
  if (!in) fail("noise_from: cannot read %s", file.c_str());
  double last = 0;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("gns")) continue;  // a torn last line, or no estimate
    const nlohmann::json& g = j["gns"];
    if (g.is_object() && g.contains("b_simple") && g["b_simple"].is_number()) last = g["b_simple"].get<double>();
  }
  if (!(last > 0))
    fail("noise_from: %s logs no gradient noise scale (it needs dp > 1, or grad_accum > 1 on one rank)", file.c_str());
  return last;
}

}  // namespace mt::plan
