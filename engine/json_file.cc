#include "engine/json_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_format.h"

namespace beaconkv {

absl::StatusOr<std::string> ReadTextFile(const std::string& path, std::string_view what) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    return absl::NotFoundError(absl::StrFormat("%s: cannot open %s: a directory", path, what));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("%s: cannot open %s", path, what));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrFormat("%s: read error", path));
  return text.str();
}

absl::StatusOr<nlohmann::json> ParseJsonObject(const std::string& text, const std::string& file) {
  nlohmann::json obj;
  try {
    obj = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: not valid JSON: %s", file, e.what()));
  }
  if (!obj.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: top level must be a JSON object, got %s", file, obj.type_name()));
  }
  return obj;
}

}  // namespace beaconkv
