// Small JSON files of a model directory (config.json, tokenizer.json): reading and parsing
// with errors that name the file.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace beaconkv {

// The whole file; kNotFound "<path>: cannot open <what>" when it cannot be opened.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, std::string_view what);

// `text` parsed as a JSON object; kInvalidArgument naming `file` otherwise.
absl::StatusOr<nlohmann::json> ParseJsonObject(const std::string& text, const std::string& file);

}  // namespace beaconkv
