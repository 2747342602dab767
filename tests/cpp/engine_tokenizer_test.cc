// CharTokenizer: the Hugging Face WordLevel tokenizer.json, UTF-8 characters of every length, and
// errors that name the file and field or the offending character.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace beaconkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kFile[] = "/models/m/tokenizer.json";

// Ids: 0 <pad>, 1 <bos>, 2 <eos>, 3 "\n", 4 "a", 5 "b", 6 "é" (2 bytes), 7 "∑" (3 bytes),
// 8 "😀" (4 bytes, written as a surrogate pair escape), 9 "<sep>", 10 "<", 11 ">".
// The sections the engine does not read are abbreviated.
constexpr char kTokenizer[] = R"({
 "version": "1.0",
 "added_tokens": [{"id": 0, "content": "<pad>", "special": true}],
 "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated"},
 "model": {"type": "WordLevel", "unk_token": null,
           "vocab": {"<pad>": 0, "<bos>": 1, "<eos>": 2, "\n": 3, "a": 4, "b": 5, "\u00e9": 6,
                     "∑": 7, "\ud83d\ude00": 8, "<sep>": 9, "<": 10, ">": 11}}
})";

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

CharTokenizer MustParse(const std::string& text) {
  absl::StatusOr<CharTokenizer> tok = CharTokenizer::FromJson(text, kFile);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

TEST(CharTokenizerTest, EncodesAndDecodesMultiByteCharacters) {
  const CharTokenizer tok = MustParse(kTokenizer);
  EXPECT_EQ(tok.vocab_size(), 12);
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.vocab()[8], "\xF0\x9F\x98\x80");
  EXPECT_TRUE(tok.IsSpecial(9));
  EXPECT_FALSE(tok.IsSpecial(10));  // "<" alone is one character
  EXPECT_FALSE(tok.IsSpecial(12));

  const std::string text = "ab\u00e9\n\u2211\xF0\x9F\x98\x80<>a";
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(4, 5, 6, 3, 7, 8, 10, 11, 4));
  EXPECT_EQ(tok.Decode(*ids), text);

  ids = tok.Encode("");
  ASSERT_TRUE(ids.ok());
  EXPECT_TRUE(ids->empty());
}

TEST(CharTokenizerTest, DecodeDropsPadBosEosAndKeepsOtherSpecials) {
  const CharTokenizer tok = MustParse(kTokenizer);
  const std::vector<int32_t> ids = {1, 4, 9, 5, 0, 6, 2};
  EXPECT_EQ(tok.Decode(ids), "a<sep>b\u00e9");
  EXPECT_EQ(tok.Decode({}), "");
}

TEST(CharTokenizerTest, DecodeMarksOutOfRangeIds) {
  const CharTokenizer tok = MustParse(kTokenizer);
  const std::vector<int32_t> ids = {4, 12, -1, 5};
  EXPECT_EQ(tok.Decode(ids), "a\uFFFD\uFFFDb");
}

TEST(CharTokenizerTest, SpecialTokenTextIsEncodedCharByCharOrRejected) {
  const CharTokenizer tok = MustParse(kTokenizer);
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode("<sep>");
  ASSERT_FALSE(ids.ok());
  EXPECT_THAT(Msg(ids.status()), HasSubstr("'s' (U+0073) at character index 1 (byte offset 1)"));
}

TEST(CharTokenizerTest, UnknownCharacterIsNamedWithItsOffsets) {
  const CharTokenizer tok = MustParse(kTokenizer);
  // "a", "é" (2 bytes), "∑" (3 bytes), then the unknown "ü" at character 3, byte 6.
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode("a\u00e9\u2211\u00fcb");
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ids.status()),
              HasSubstr(absl::StrCat(kFile,
                                     ": character '\u00fc' (U+00FC) at character index 3 "
                                     "(byte offset 6) is not in the vocabulary")));
  ids = tok.Encode("ab\t");
  EXPECT_THAT(Msg(ids.status()), HasSubstr("character U+0009 at character index 2"));
  ids = tok.Encode("\xF0\x9F\x98\x81");  // a different emoji
  EXPECT_THAT(Msg(ids.status()), HasSubstr("U+1F601"));
}

TEST(CharTokenizerTest, InvalidUtf8TextIsAnError) {
  const CharTokenizer tok = MustParse(kTokenizer);
  for (const std::string& bad : {std::string("ab\xC3"), std::string("a\x80"),
                                 std::string("a\xC0\xAF"), std::string("a\xED\xA0\x80")}) {
    absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(bad);
    ASSERT_FALSE(ids.ok());
    EXPECT_THAT(Msg(ids.status()), HasSubstr("not valid UTF-8"));
  }
  EXPECT_THAT(Msg(tok.Encode("ab\xC3").status()), HasSubstr("byte offset 2"));
}

TEST(DecodeUtf8CharTest, AcceptsValidAndRejectsInvalidSequences) {
  char32_t cp = 0;
  EXPECT_EQ(DecodeUtf8Char("a", 0, &cp), 1);
  EXPECT_EQ(cp, U'a');
  EXPECT_EQ(DecodeUtf8Char("\xC3\xA9", 0, &cp), 2);
  EXPECT_EQ(cp, 0xE9u);
  EXPECT_EQ(DecodeUtf8Char("\xE2\x88\x91", 0, &cp), 3);
  EXPECT_EQ(cp, 0x2211u);
  EXPECT_EQ(DecodeUtf8Char("\xF4\x8F\xBF\xBF", 0, &cp), 4);
  EXPECT_EQ(cp, 0x10FFFFu);
  EXPECT_EQ(DecodeUtf8Char(std::string_view("\0", 1), 0, &cp), 1);
  EXPECT_EQ(cp, 0u);
  EXPECT_EQ(DecodeUtf8Char("xy", 1, &cp), 1);
  EXPECT_EQ(cp, U'y');

  EXPECT_EQ(DecodeUtf8Char("", 0, &cp), 0);
  EXPECT_EQ(DecodeUtf8Char("\x80", 0, &cp), 0);              // stray continuation
  EXPECT_EQ(DecodeUtf8Char("\xC0\x80", 0, &cp), 0);          // overlong NUL
  EXPECT_EQ(DecodeUtf8Char("\xE0\x80\xAF", 0, &cp), 0);      // overlong '/'
  EXPECT_EQ(DecodeUtf8Char("\xF0\x80\x80\xAF", 0, &cp), 0);  // overlong '/'
  EXPECT_EQ(DecodeUtf8Char("\xED\xA0\x80", 0, &cp), 0);      // UTF-16 surrogate
  EXPECT_EQ(DecodeUtf8Char("\xF4\x90\x80\x80", 0, &cp), 0);  // above U+10FFFF
  EXPECT_EQ(DecodeUtf8Char("\xE2\x88", 0, &cp), 0);          // truncated
  EXPECT_EQ(DecodeUtf8Char("\xC3\x41", 0, &cp), 0);          // bad continuation
  EXPECT_EQ(DecodeUtf8Char("\xFF", 0, &cp), 0);
}

TEST(CharTokenizerTest, LoadsFromFileOrModelDirectory) {
  std::string root = ::testing::TempDir();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  const std::string dir = absl::StrCat(root, "/bkv_tokenizer_test_", getpid());
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir + "/tokenizer.json", std::ios::binary);
    out << kTokenizer;
  }
  for (const std::string& where : {dir, dir + "/tokenizer.json"}) {
    absl::StatusOr<CharTokenizer> tok = CharTokenizer::Load(where);
    ASSERT_TRUE(tok.ok()) << tok.status();
    EXPECT_EQ(tok->vocab_size(), 12);
    // Errors name the file that was read.
    EXPECT_THAT(Msg(tok->Encode("z").status()), HasSubstr(dir + "/tokenizer.json: "));
  }
  std::filesystem::remove_all(dir);
  absl::StatusOr<CharTokenizer> tok = CharTokenizer::Load(dir + "/tokenizer.json");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(tok.status()), HasSubstr(dir + "/tokenizer.json"));
}

struct BadTokenizer {
  std::string label;
  std::string text;
  std::vector<std::string> expected;
};

// A tokenizer.json whose model.vocab is `vocab` (a JSON map).
std::string WithVocab(const std::string& vocab) {
  return absl::StrCat(R"({"version": "1.0", "model": {"type": "WordLevel", "vocab": )", vocab,
                      "}}");
}

class BadTokenizerTest : public ::testing::TestWithParam<BadTokenizer> {};

TEST_P(BadTokenizerTest, ErrorNamesFileAndField) {
  const BadTokenizer& b = GetParam();
  absl::StatusOr<CharTokenizer> tok = CharTokenizer::FromJson(b.text, kFile);
  ASSERT_FALSE(tok.ok()) << b.label;
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(tok.status()), HasSubstr(absl::StrCat(kFile, ": ")));
  for (const std::string& piece : b.expected) EXPECT_THAT(Msg(tok.status()), HasSubstr(piece));
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, BadTokenizerTest,
    ::testing::Values(
        BadTokenizer{"not_json", "{\"format\": ", {"not valid JSON"}},
        BadTokenizer{"not_object", "[\"a\"]", {"must be a JSON object"}},
        BadTokenizer{"missing_model", R"({"version": "1.0"})", {"'model' is missing"}},
        BadTokenizer{"model_not_object", R"({"model": "WordLevel"})", {"'model'", "object"}},
        BadTokenizer{
            "missing_type", R"({"model": {"vocab": {"a": 0}}})", {"'model.type' is missing"}},
        BadTokenizer{"bpe_model",
                     R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})",
                     {"'model.type'", "\"BPE\"", "WordLevel", "character-level"}},
        BadTokenizer{"private_format",
                     R"({"format": "beaconkv-char-v1", "vocab": ["a"], "pad_id": 0})",
                     {"'model' is missing"}},
        BadTokenizer{
            "missing_vocab", R"({"model": {"type": "WordLevel"}})", {"'model.vocab' is missing"}},
        BadTokenizer{
            "vocab_list", WithVocab(R"(["<pad>", "<bos>", "<eos>"])"), {"'model.vocab'", "map"}},
        BadTokenizer{"vocab_empty", WithVocab("{}"), {"'model.vocab'", "non-empty"}},
        BadTokenizer{"id_not_integer",
                     WithVocab(R"({"<pad>": 0, "<bos>": 1, "<eos>": 2, "a": "3"})"),
                     {"'model.vocab[\"a\"]'", "integer"}},
        BadTokenizer{"id_float",
                     WithVocab(R"({"<pad>": 0, "<bos>": 1.0, "<eos>": 2})"),
                     {"'model.vocab[\"<bos>\"]'", "integer"}},
        BadTokenizer{"id_gap",
                     WithVocab(R"({"<pad>": 0, "<bos>": 1, "<eos>": 2, "a": 4})"),
                     {"'model.vocab[\"a\"]'", "is 4", "0..3", "dense"}},
        BadTokenizer{"id_negative",
                     WithVocab(R"({"<pad>": 0, "<bos>": 1, "<eos>": -1})"),
                     {"'model.vocab[\"<eos>\"]'", "-1"}},
        BadTokenizer{"entry_two_chars",
                     WithVocab(R"({"<pad>": 0, "<bos>": 1, "<eos>": 2, "ab": 3})"),
                     {"'model.vocab[\"ab\"]'", "neither one character nor"}},
        BadTokenizer{"entry_empty",
                     WithVocab(R"({"<pad>": 0, "<bos>": 1, "<eos>": 2, "": 3})"),
                     {"'model.vocab[\"\"]'"}},
        BadTokenizer{"entry_half_special",
                     WithVocab(R"({"<pad>": 0, "<bos": 1, "<eos>": 2})"),
                     {"'model.vocab[\"<bos\"]'"}},
        BadTokenizer{"duplicate_id",
                     WithVocab(R"({"<pad>": 0, "<bos>": 1, "<eos>": 2, "a": 2})"),
                     {"is 2, the id of"}},
        BadTokenizer{"bos_missing",
                     WithVocab(R"({"<pad>": 0, "<eos>": 1, "a": 2})"),
                     {"'model.vocab'", "no \"<bos>\" entry"}}),
    [](const ::testing::TestParamInfo<BadTokenizer>& info) { return info.param.label; });

}  // namespace
}  // namespace beaconkv
