#include "engine/model_weights.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"

namespace beaconkv {
namespace {

// Reads tensors from one file and remembers which ones were used.
class TensorReader {
 public:
  TensorReader(const SafetensorsFile& file, const WeightLoadOptions& options)
      : file_(file), options_(options) {}

  absl::Status Read(const std::string& name, const std::vector<int64_t>& shape,
                    std::vector<float>* out) {
    BKV_ASSIGN_OR_RETURN(std::vector<float> data, file_.ReadFloat32(name, shape));
    BKV_RETURN_IF_ERROR(CheckFinite(name, data));
    *out = std::move(data);
    used_.insert(name);
    return absl::OkStatus();
  }

  // NaN or Inf in a weight poisons every logit (the model then decodes one token forever):
  // an error, or one warning per tensor when options_.allow_nonfinite.
  absl::Status CheckFinite(const std::string& name, const std::vector<float>& data) const {
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < data.size(); ++i) {
      if (!std::isfinite(data[i])) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++bad;
      }
    }
    if (bad == 0) return absl::OkStatus();
    const std::string what = absl::StrFormat(
        "%s: tensor '%s' has %d non-finite values of %d (first at flat index %d: %f)", file_.path(),
        name, bad, data.size(), first, data[first]);
    if (!options_.allow_nonfinite) {
      return absl::InvalidArgumentError(
          absl::StrCat(what,
                       "; the model would produce NaN logits. Load anyway with "
                       "allow_nonfinite (CLI: --allow-nonfinite)"));
    }
    std::fprintf(stderr, "beaconkv: warning: %s (loaded: allow_nonfinite)\n", what.c_str());
    return absl::OkStatus();
  }

  // Leaves `out` empty when the tensor is absent.
  absl::Status ReadOptional(const std::string& name, const std::vector<int64_t>& shape,
                            std::vector<float>* out) {
    if (!file_.Has(name)) {
      out->clear();
      return absl::OkStatus();
    }
    return Read(name, shape, out);
  }

  // Every tensor in the file must have been read, except ones HF saves but never uses.
  absl::Status CheckAllUsed(const ModelConfig& config) const {
    for (const TensorInfo& t : file_.tensors()) {
      if (used_.contains(t.name) || absl::EndsWith(t.name, ".rotary_emb.inv_freq")) continue;
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tensor '%s' (shape %s) is not used by a %s model with num_hidden_layers=%d; the "
          "engine does not support it or the file does not match config.json",
          file_.path(), t.name, ShapeString(t.shape),
          config.architecture.empty() ? "Llama-architecture" : config.architecture,
          config.num_layers));
    }
    return absl::OkStatus();
  }

 private:
  const SafetensorsFile& file_;
  WeightLoadOptions options_;
  absl::flat_hash_set<std::string> used_;
};

absl::Status LoadLayer(const ModelConfig& c, int32_t index, TensorReader& reader, LayerWeights& w) {
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, hd = c.head_dim;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * hd;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * hd;
  const std::string p = absl::StrCat("model.layers.", index, ".");
  const std::string attn = p + "self_attn.";
  const struct {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float>* out;
    bool required;
  } tensors[] = {
      {p + "input_layernorm.weight", {hidden}, &w.input_norm, true},
      {attn + "q_proj.weight", {q_dim, hidden}, &w.q_proj, true},
      {attn + "k_proj.weight", {kv_dim, hidden}, &w.k_proj, true},
      {attn + "v_proj.weight", {kv_dim, hidden}, &w.v_proj, true},
      {attn + "o_proj.weight", {hidden, q_dim}, &w.o_proj, true},
      {attn + "q_proj.bias", {q_dim}, &w.q_bias, false},
      {attn + "k_proj.bias", {kv_dim}, &w.k_bias, false},
      {attn + "v_proj.bias", {kv_dim}, &w.v_bias, false},
      {attn + "q_norm.weight", {hd}, &w.q_norm, false},
      {attn + "k_norm.weight", {hd}, &w.k_norm, false},
      {p + "post_attention_layernorm.weight", {hidden}, &w.post_norm, true},
      {p + "mlp.gate_proj.weight", {inter, hidden}, &w.gate_proj, true},
      {p + "mlp.up_proj.weight", {inter, hidden}, &w.up_proj, true},
      {p + "mlp.down_proj.weight", {hidden, inter}, &w.down_proj, true},
  };
  for (const auto& t : tensors) {
    BKV_RETURN_IF_ERROR(t.required ? reader.Read(t.name, t.shape, t.out)
                                   : reader.ReadOptional(t.name, t.shape, t.out));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> LoadModelWeightsFrom(const ModelConfig& config,
                                                  const SafetensorsFile& file,
                                                  const WeightLoadOptions& options) {
  BKV_RETURN_IF_ERROR(config.Validate());
  const int64_t vocab = config.vocab_size, hidden = config.hidden_size;
  TensorReader reader(file, options);
  ModelWeights w;
  w.config = config;
  BKV_RETURN_IF_ERROR(reader.Read("model.embed_tokens.weight", {vocab, hidden}, &w.embed));
  // One layer at a time, never sized up front: a config claiming millions of layers fails at
  // the first missing tensor instead of allocating for all of them.
  for (int32_t i = 0; i < config.num_layers; ++i) {
    BKV_RETURN_IF_ERROR(LoadLayer(config, i, reader, w.layers.emplace_back()));
  }
  BKV_RETURN_IF_ERROR(reader.Read("model.norm.weight", {hidden}, &w.final_norm));
  if (config.tie_word_embeddings) {
    // A tied checkpoint may still carry lm_head.weight; it must then have the right shape, but
    // the embedding is what the model uses.
    std::vector<float> unused;
    BKV_RETURN_IF_ERROR(reader.ReadOptional("lm_head.weight", {vocab, hidden}, &unused));
    w.lm_head = w.embed;
  } else if (!file.Has("lm_head.weight")) {
    return absl::NotFoundError(absl::StrFormat(
        "%s: tensor 'lm_head.weight' is missing and config field 'tie_word_embeddings' is false",
        file.path()));
  } else {
    BKV_RETURN_IF_ERROR(reader.Read("lm_head.weight", {vocab, hidden}, &w.lm_head));
  }
  BKV_RETURN_IF_ERROR(reader.CheckAllUsed(config));
  return w;
}

absl::StatusOr<ModelWeights> LoadModelWeights(const std::string& model_dir,
                                              const WeightLoadOptions& options) {
  BKV_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromFile(model_dir + "/config.json"));
  BKV_ASSIGN_OR_RETURN(SafetensorsFile file,
                       SafetensorsFile::Open(model_dir + "/model.safetensors"));
  return LoadModelWeightsFrom(config, file, options);
}

}  // namespace beaconkv
