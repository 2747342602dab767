// The character-level tokenizer of the tiny reasoner, read from the model directory's Hugging Face
// `tokenizer.json` (the one file the Python side, transformers and vLLM read too; written by
// integration/beaconkv/tokenizer.py). Only a character-level WordLevel model is accepted:
//   {"model": {"type": "WordLevel", "vocab": {"<pad>": 0, "<bos>": 1, "<eos>": 2, "\n": 3, ...}},
//    ...}
// Token id i is the vocab key mapped to i; ids are dense. A key is either exactly one Unicode
// character (any UTF-8 length) or a special token "<...>"; pad/bos/eos are the ids of "<pad>",
// "<bos>", "<eos>". The pre-tokenizer, post-processor and decoder sections are not read: the
// engine encodes each character to its id (no merges) and prepends bos itself.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace beaconkv {

class CharTokenizer {
 public:
  // Reads a tokenizer file, or the tokenizer.json inside a model directory.
  static absl::StatusOr<CharTokenizer> Load(const std::string& path_or_model_dir);
  // Parses the text of a tokenizer file; `file_name_for_errors` prefixes every error message.
  static absl::StatusOr<CharTokenizer> FromJson(const std::string& text,
                                                const std::string& file_name_for_errors);

  // One id per character of the UTF-8 `text`. Special tokens are never produced (their text is
  // encoded character by character, and fails unless every character is in the vocabulary).
  // Errors name the first unknown character, its character index and its byte offset, or the
  // byte offset of invalid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;

  // The text of `ids`. pad, bos and eos decode to ""; other special tokens decode to their text
  // ("<sep>"). An id outside [0, vocab_size) decodes to U+FFFD, the Unicode replacement
  // character, so that a model whose vocab_size exceeds the tokenizer's stays printable.
  std::string Decode(absl::Span<const int32_t> ids) const;

  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.size()); }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }
  const std::vector<std::string>& vocab() const { return vocab_; }  // [vocab_size]
  bool IsSpecial(int32_t id) const;  // a "<...>" entry; false for out-of-range ids

 private:
  CharTokenizer() = default;

  std::string source_;                               // the file, for error messages
  std::vector<std::string> vocab_;                   // [vocab_size] UTF-8 text of each id
  std::vector<bool> special_;                        // [vocab_size] entry is "<...>"
  absl::flat_hash_map<char32_t, int32_t> char_ids_;  // code point -> id, one-character entries
  int32_t pad_id_ = 0;
  int32_t bos_id_ = 0;
  int32_t eos_id_ = 0;
};

// Decodes one UTF-8 character of `text` starting at byte `pos`. Returns its length in bytes and
// sets `*code_point`, or returns 0 for invalid UTF-8 (truncated or overlong sequences, UTF-16
// surrogates, values above U+10FFFF, stray continuation bytes).
int DecodeUtf8Char(std::string_view text, size_t pos, char32_t* code_point);

}  // namespace beaconkv
