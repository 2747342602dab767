#include "engine/tokenizer.h"

#include <filesystem>
#include <limits>
#include <system_error>

#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "engine/json_file.h"
#include "nlohmann/json.hpp"

namespace beaconkv {
namespace {

using nlohmann::json;

constexpr char kModelType[] = "WordLevel";
constexpr char kReplacementChar[] = "\xEF\xBF\xBD";  // U+FFFD

absl::Status FieldError(const std::string& file, const std::string& field,
                        const std::string& message) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: field '%s' %s", file, field, message));
}

// "'é' (U+00E9)", or just "U+000A" for control characters.
std::string DescribeChar(std::string_view utf8, char32_t cp) {
  const std::string code = absl::StrFormat("U+%04X", static_cast<uint32_t>(cp));
  if (cp < 0x20 || cp == 0x7f) return code;
  return absl::StrFormat("'%s' (%s)", utf8, code);
}

}  // namespace

int DecodeUtf8Char(std::string_view text, size_t pos, char32_t* code_point) {
  if (pos >= text.size()) return 0;
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  const unsigned char b0 = byte(0);
  int len;
  char32_t cp;
  char32_t min_cp;
  if (b0 < 0x80) {
    *code_point = b0;
    return 1;
  } else if ((b0 & 0xe0) == 0xc0) {
    len = 2, cp = b0 & 0x1f, min_cp = 0x80;
  } else if ((b0 & 0xf0) == 0xe0) {
    len = 3, cp = b0 & 0x0f, min_cp = 0x800;
  } else if ((b0 & 0xf8) == 0xf0) {
    len = 4, cp = b0 & 0x07, min_cp = 0x10000;
  } else {
    return 0;  // continuation byte or 0xf8..0xff
  }
  if (text.size() - pos < static_cast<size_t>(len)) return 0;
  for (int i = 1; i < len; ++i) {
    if ((byte(i) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i) & 0x3f);
  }
  if (cp < min_cp || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  *code_point = cp;
  return len;
}

absl::StatusOr<CharTokenizer> CharTokenizer::Load(const std::string& path_or_model_dir) {
  std::string path = path_or_model_dir;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) path = path + "/tokenizer.json";
  BKV_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, "tokenizer file"));
  return FromJson(text, path);
}

absl::StatusOr<CharTokenizer> CharTokenizer::FromJson(const std::string& text,
                                                      const std::string& file_name_for_errors) {
  const std::string& file = file_name_for_errors;
  BKV_ASSIGN_OR_RETURN(json parsed, ParseJsonObject(text, file));
  const json& obj = parsed;
  auto model = obj.find("model");
  if (model == obj.end()) return FieldError(file, "model", "is missing");
  if (!model->is_object()) return FieldError(file, "model", "must be an object");
  auto type = model->find("type");
  if (type == model->end()) return FieldError(file, "model.type", "is missing");
  if (*type != kModelType) {
    return FieldError(file, "model.type",
                      absl::StrFormat("is %s, expected \"%s\" (the engine reads character-level "
                                      "Hugging Face tokenizers only)",
                                      type->dump(), kModelType));
  }
  auto vocab = model->find("vocab");
  if (vocab == model->end()) return FieldError(file, "model.vocab", "is missing");
  if (!vocab->is_object() || vocab->empty()) {
    return FieldError(file, "model.vocab", "must be a non-empty map from token to id");
  }
  if (vocab->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return FieldError(file, "model.vocab", "has more entries than fit in int32");
  }
  const int64_t n = static_cast<int64_t>(vocab->size());

  CharTokenizer tok;
  tok.source_ = file;
  tok.vocab_.resize(n);
  tok.special_.resize(n);
  std::vector<bool> filled(n, false);
  for (const auto& [s, id_json] : vocab->items()) {
    const std::string where = absl::StrFormat("model.vocab[%s]", json(s).dump());
    if (!id_json.is_number_integer()) {
      return FieldError(file, where,
                        absl::StrFormat("must be an integer id, got %s", id_json.dump()));
    }
    const bool in_range =
        id_json.is_number_unsigned() && id_json.get<uint64_t>() < static_cast<uint64_t>(n);
    if (!in_range) {
      return FieldError(
          file, where,
          absl::StrFormat("is %s, outside 0..%d (ids must be dense)", id_json.dump(), n - 1));
    }
    const int32_t id = id_json.get<int32_t>();
    if (filled[id]) {
      return FieldError(
          file, where, absl::StrFormat("is %d, the id of %s too", id, json(tok.vocab_[id]).dump()));
    }
    char32_t cp = 0;
    const int len = DecodeUtf8Char(s, 0, &cp);
    const bool one_char = len > 0 && static_cast<size_t>(len) == s.size();
    const bool special = !one_char && s.size() >= 2 && s.front() == '<' && s.back() == '>';
    if (!one_char && !special) {
      return FieldError(file, where, "is neither one character nor a <special> token");
    }
    if (one_char) tok.char_ids_[cp] = id;
    tok.vocab_[id] = s;
    tok.special_[id] = special;
    filled[id] = true;
  }
  // n distinct ids in [0, n): every id is filled.
  for (auto [name, out] : {std::pair{"<pad>", &tok.pad_id_}, std::pair{"<bos>", &tok.bos_id_},
                           std::pair{"<eos>", &tok.eos_id_}}) {
    auto it = vocab->find(name);
    if (it == vocab->end()) {
      return FieldError(file, "model.vocab", absl::StrFormat("has no \"%s\" entry", name));
    }
    *out = it->get<int32_t>();
  }
  return tok;
}

absl::StatusOr<std::vector<int32_t>> CharTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  size_t pos = 0;
  int64_t index = 0;
  while (pos < text.size()) {
    char32_t cp = 0;
    const int len = DecodeUtf8Char(text, pos, &cp);
    if (len == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tokenizer %s: text is not valid UTF-8 at character index %d (byte offset %d)", source_,
          index, pos));
    }
    auto it = char_ids_.find(cp);
    if (it == char_ids_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tokenizer %s: character %s at character index %d (byte offset %d) is not in the "
          "vocabulary",
          source_, DescribeChar(text.substr(pos, len), cp), index, pos));
    }
    ids.push_back(it->second);
    pos += len;
    ++index;
  }
  return ids;
}

bool CharTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[id];
}

std::string CharTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      out += kReplacementChar;
    } else if (id != pad_id_ && id != bos_id_ && id != eos_id_) {
      out += vocab_[id];
    }
  }
  return out;
}

}  // namespace beaconkv
