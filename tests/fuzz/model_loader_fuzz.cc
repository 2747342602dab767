// libFuzzer target: the model-directory loader — config.json, model.safetensors and
// tokenizer.json — on arbitrary bytes. Input layout: u16 little-endian length + config text,
// u16 length + tokenizer text, the rest is the safetensors file. Any input must give a
// status (never a crash, a sanitizer report, or an allocation beyond what the file holds);
// a load that succeeds must satisfy the loader's promises.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/model_config.h"
#include "engine/model_policy.h"
#include "engine/model_weights.h"
#include "engine/safetensors.h"
#include "engine/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// Takes a u16-length-prefixed string from the front of [*data, *data + *size).
std::string TakeString(const uint8_t** data, size_t* size) {
  if (*size < 2) return {};
  size_t n = (*data)[0] | ((*data)[1] << 8);
  *data += 2;
  *size -= 2;
  if (n > *size) n = *size;
  std::string s(reinterpret_cast<const char*>(*data), n);
  *data += n;
  *size -= n;
  return s;
}

// An anonymous in-memory file, reused across inputs, so SafetensorsFile::Open (which maps a
// path) runs without touching the disk.
const std::string& MemFile(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("safetensors", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(ftruncate(fd, 0) == 0);
  FUZZ_CHECK(pwrite(fd, data, size, 0) == static_cast<ssize_t>(size));
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace beaconkv;
  const std::string config_text = TakeString(&data, &size);
  const std::string tokenizer_text = TakeString(&data, &size);

  absl::StatusOr<CharTokenizer> tok = CharTokenizer::FromJson(tokenizer_text, "tokenizer.json");
  if (tok.ok()) {
    FUZZ_CHECK(tok->vocab_size() > 0);
    FUZZ_CHECK(tok->eos_id() >= 0 && tok->eos_id() < tok->vocab_size());
    (void)tok->Encode("Ab;\n");
  }

  const std::string& path = MemFile(data, size);
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  if (file.ok()) {
    for (const TensorInfo& t : file->tensors()) {
      FUZZ_CHECK(t.data_begin <= t.data_end);
      FUZZ_CHECK(t.data_end - t.data_begin == t.numel() * DTypeSize(t.dtype));
      FUZZ_CHECK(static_cast<int64_t>(file->RawBytes(t.name).size()) == t.data_end - t.data_begin);
    }
  }
  // The setting the model ships: a spec that is returned builds on its own; with a user's
  // budget and interval it may be refused (a budget below its protected tokens), not crash.
  absl::StatusOr<std::string> spec = ModelPolicySpecFromJson(config_text, "config.json");
  if (spec.ok() && !spec->empty()) {
    FUZZ_CHECK(BuildPolicyConfig({"model", {}, {}, {}}, *spec).ok());
    (void)BuildPolicyConfig({"model", 96, 16, {}}, *spec);
  }
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(config_text, "config.json");
  if (!config.ok() || !file.ok()) return 0;
  FUZZ_CHECK(config->Validate().ok());
  for (bool allow : {false, true}) {
    absl::StatusOr<ModelWeights> w =
        LoadModelWeightsFrom(*config, *file, {.allow_nonfinite = allow});
    if (!w.ok()) continue;
    FUZZ_CHECK(static_cast<int64_t>(w->embed.size()) ==
               static_cast<int64_t>(config->vocab_size) * config->hidden_size);
    FUZZ_CHECK(static_cast<int32_t>(w->layers.size()) == config->num_layers);
    if (!allow)
      for (float x : w->embed) FUZZ_CHECK(std::isfinite(x));
  }
  return 0;
}
