#include "config/ignored_options.h"

#include "config/options.h"
#include "runtime/check.h"

namespace mt::config {

void check_no_ignored_options(const TrainOptions& o, const std::vector<std::pair<std::string, std::string>>& given) {
  for (const auto& [key, value] : given) {
    if (key.rfind("moe.", 0) == 0 && key != "moe.experts" && !o.model.moe.enabled())
      fail("%s=%s needs a mixture of experts (moe.experts > 0, e.g. model=tiny-moe): a dense model has no router "
           "or experts for it to apply to", key.c_str(), value.c_str());
    if ((key == "loss_scale.init" || key == "loss_scale.growth_interval") && o.precision != DType::f16)
      fail("%s=%s needs precision=fp16: only fp16 scales its loss (fp32 and bf16 have the range without it); "
           "loss_scale.max_skips applies to every precision", key.c_str(), value.c_str());
    if ((key == "trace.start" || key == "trace.steps") && !o.trace.on)
      fail("%s=%s needs trace=1: it chooses the steps a trace covers, and no trace is written", key.c_str(),
           value.c_str());
  }
}

}  // namespace mt::config
