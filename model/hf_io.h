// Weight interchange with Hugging Face GPT-2 safetensors files.
//
// Names: "transformer.wte.weight", "transformer.h.{i}.attn.c_attn.weight", ... (the "transformer."
// prefix is optional on import, as in the original GPT-2 checkpoints). Orientation: HF's Conv1D
// layers store their weight (in, out); minitrain stores matrices (out, in) like nn.Linear, so the
// four block matrices are transposed on the way in and out. The embedding is stored unpadded
// (V, C) in the file and padded with zero rows to the model's padded vocabulary inside.
#pragma once
#include <string>

#include "model/gpt.h"
#include "runtime/param_store.h"

namespace mt::model {

// True for the weights HF stores transposed (Conv1D): c_attn, attn.c_proj, c_fc, mlp.c_proj.
bool hf_is_conv1d(const std::string& name);

// Loads master weights from `path` into `store` (and refreshes the compute copy). Fails naming the
// file and the tensor on a missing tensor or a shape that does not match the model's config.
void import_hf(const GPT& model, ParamStore& store, const std::string& path);

// Writes master weights (the store's full layout: `master` holds total_numel() values, e.g. the
// store's own master or one gathered from ZeRO shards) as an HF-named, HF-oriented fp32 safetensors
// file, atomically.
void export_hf(const GPT& model, const ParamStore& store, const float* master, const std::string& path);

}  // namespace mt::model
