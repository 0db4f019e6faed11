// Tokenizer tests: UTF-8 handling, GPT-2's pre-tokenizer, the .tiktoken reader,
// golden ids from the reference implementation (tiktoken,
// tests/fixtures/tokenizer/gen_golden.py), the corpus, the whole KJV and random
// strings compared with tiktoken live, tokenizer.json loading, errors and the CLI.
//
// The GPT-2 vocabulary (gpt2.tiktoken) is not in git: scripts/setup.sh puts it
// in data::kDefaultTokenizerDir (GRADACCUM_TOKENIZER_DIR overrides) and installs
// tiktoken in the venv ($GRADACCUM_VENV, default /opt/gradaccum/venv). Tests
// that need either fail, with that hint, when it is absent; none skips.
#include "gradaccum/data/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gradaccum/base/check.h"
#include "gradaccum/data/byte_level_bpe.h"
#include "gradaccum/data/kjv.h"
#include "gradaccum/data/pre_tokenizer.h"
#include "gradaccum/data/tiktoken_merges.h"
#include "gradaccum/data/tiktoken_ranks.h"
#include "gradaccum/data/unicode_tables.h"
#include "gradaccum/data/utf8.h"
#include "test_support.h"

namespace gradaccum::data {
namespace tokenizer_test {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kDataDir = std::string(GRADACCUM_TEST_DATA) + "/tokenizer";

std::string gpt2_dir() { return gradaccum::testing::gpt2_tokenizer_dir(); }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

using gradaccum::testing::split_lines;

std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::string to_utf8(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

// The message of the gradaccum::Error that f throws ("" if none).
using gradaccum::testing::error_of;

// A fresh directory per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("gradaccum_tok_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct CommandResult {
  int status;
  std::string out, err;
};

// Runs a shell command, capturing its output through files in dir.
CommandResult run(const std::string& command, const fs::path& dir) {
  const std::string out = (dir / "stdout").string(), err = (dir / "stderr").string();
  const int raw = std::system((command + " > '" + out + "' 2> '" + err + "'").c_str());
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, read_bytes(out), read_bytes(err)};
}

// The venv's Python, which runs the reference scripts (-B: no __pycache__ in
// the source tree).
std::string venv_python() { return gradaccum::testing::venv_program("python"); }

bool have_tiktoken() {
  static const bool have = std::system(("'" + venv_python() + "' -c 'import tiktoken' > /dev/null 2>&1").c_str()) == 0;
  return have;
}

// The GPT-2 tokenizer, loaded once; fails the test with a hint when absent.
// Why the GPT-2 tokenizer did not load ("" when it did).
std::string gpt2_load_error;

const Tokenizer* gpt2() {
  static const Tokenizer* tokenizer = [] {
    try {
      return new Tokenizer(Tokenizer::load(gpt2_dir()));
    } catch (const Error& e) {
      gpt2_load_error = e.what();
      return static_cast<Tokenizer*>(nullptr);
    }
  }();
  return tokenizer;
}
#define REQUIRE_GPT2()                                                                            \
  ASSERT_NE(gpt2(), nullptr) << "GPT-2 vocabulary (gpt2.tiktoken) not found: " << gpt2_load_error \
                             << ". Run scripts/setup.sh, or set GRADACCUM_TOKENIZER_DIR"

// GPT-2's .tiktoken file in the GPT-2 directory (scripts/setup.sh installs it).
std::string gpt2_tiktoken_path() { return gpt2_dir() + "/gpt2.tiktoken"; }
#define REQUIRE_GPT2_TIKTOKEN()                                              \
  ASSERT_TRUE(fs::exists(gpt2_tiktoken_path()))                              \
      << gpt2_tiktoken_path() << " not found. Run scripts/setup.sh, or set " \
      << "GRADACCUM_TOKENIZER_DIR to a directory holding GPT-2's gpt2.tiktoken"

// The pieces of GPT-2's regex with \s as the tokenizers use it (White_Space).
std::vector<std::string> pieces(const std::string& utf8) {
  std::vector<std::string> out;
  PreTokenizer::gpt2().split(utf8, out);
  return out;
}

// BLOOM's Split pattern (its tokenizer.json's, behavior Isolated).
const std::string kBloomSplitPattern = " ?[^(\\s|[.,!?…。，、।۔،])]+";

// --- UTF-8 and Unicode classes ------------------------------------------------

TEST(TokenizerUtf8, DecodesValidText) {
  EXPECT_EQ(decode_utf8("a\xC3\xA9\xE4\xB8\x80\xF0\x9F\x98\x80"), (std::u32string{U'a', 0xE9, 0x4E00, 0x1F600}));
  EXPECT_EQ(to_utf8(decode_utf8("\xF4\x8F\xBF\xBF")), "\xF4\x8F\xBF\xBF");  // U+10FFFF round-trips
}

TEST(TokenizerUtf8, ReplacesEachMaximalInvalidSubsequenceWithOneReplacementChar) {
  const char32_t R = 0xFFFD;
  EXPECT_EQ(decode_utf8("\xFF"), (std::u32string{R}));
  EXPECT_EQ(decode_utf8("a\x80"
                        "b"),
            (std::u32string{U'a', R, U'b'}));
  EXPECT_EQ(decode_utf8("\xE2\x82 "), (std::u32string{R, U' '}));     // truncated: one U+FFFD
  EXPECT_EQ(decode_utf8("\xE2\x82"), (std::u32string{R}));            // truncated at the end
  EXPECT_EQ(decode_utf8("\xC0\xAF"), (std::u32string{R, R}));         // overlong lead byte
  EXPECT_EQ(decode_utf8("\xE0\x80\xAF"), (std::u32string{R, R, R}));  // overlong 3-byte form
  EXPECT_EQ(decode_utf8("\xED\xA0\x80"
                        "A"),
            (std::u32string{R, R, R, U'A'}));                                // surrogate
  EXPECT_EQ(decode_utf8("\xF4\x90\x80\x80"), (std::u32string{R, R, R, R}));  // above U+10FFFF
  EXPECT_EQ(decode_utf8("\xF0\x9F\x98 "), (std::u32string{R, U' '}));
}

TEST(TokenizerUnicodeTables, ClassifiesLikeTiktokenRegex) {
  EXPECT_STREQ(kUnicodeTablesVersion, "14.0.0");
  const auto white_space = [](char32_t c) { return char_class(c, SpaceDefinition::kUnicodeWhiteSpace); };
  for (char32_t c : {U' ', U'\t', U'\n', U'\v', U'\f', U'\r', char32_t{0x85}, char32_t{0xA0}, char32_t{0x1680},
                     char32_t{0x2003}, char32_t{0x3000}, char32_t{0x2028}}) {
    EXPECT_EQ(white_space(c), CharClass::kSpace) << std::hex << static_cast<unsigned>(c);
  }
  // \s is Unicode's White_Space (tiktoken's Rust regex, Hugging Face's
  // Oniguruma): not U+FEFF (Cf), U+200B (Cf), U+180E (Cf since Unicode 6.3),
  // nor U+001C..U+001F (Python's str.isspace() has those).
  for (char32_t c : {char32_t{0xFEFF}, char32_t{0x200B}, char32_t{0x180E}, char32_t{0x1C}, char32_t{0x1F},
                     char32_t{0x301}, U'\'', U'_', char32_t{0x1F600}, char32_t{0xFFFD}}) {
    EXPECT_EQ(white_space(c), CharClass::kOther) << std::hex << static_cast<unsigned>(c);
  }
  // The generated tables hold JavaScript's \s, which SpaceDefinition::kJavaScript keeps.
  EXPECT_EQ(char_class(0xFEFF), CharClass::kSpace);
  EXPECT_EQ(char_class(0x85), CharClass::kOther);
  for (char32_t c :
       {U'a', U'Z', char32_t{0xE9}, char32_t{0x4E00}, char32_t{0xAC00}, char32_t{0x5D0}, char32_t{0x1D400}}) {
    EXPECT_EQ(char_class(c), CharClass::kLetter) << std::hex << static_cast<unsigned>(c);
  }
  for (char32_t c : {U'0', char32_t{0xB2}, char32_t{0xBD}, char32_t{0x663}, char32_t{0x2160}, char32_t{0x1D7CE}}) {
    EXPECT_EQ(char_class(c), CharClass::kNumber) << std::hex << static_cast<unsigned>(c);
  }
}

// --- Pre-tokenization -----------------------------------------------------------

TEST(TokenizerPretokenizer, SplitsLikeGpt2Regex) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("I'm you're he'd"), (V{"I", "'m", " you", "'re", " he", "'d"}));
  EXPECT_EQ(pieces("DON'T"), (V{"DON", "'", "T"}));  // contractions are case-sensitive
  EXPECT_EQ(pieces("x's'"), (V{"x", "'s", "'"}));
  EXPECT_EQ(pieces("?'s"), (V{"?'", "s"}));  // a punctuation run swallows the apostrophe
  EXPECT_EQ(pieces("abc123 45"), (V{"abc", "123", " 45"}));
  EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));  // \s+(?!\S) leaves one space for the word
  EXPECT_EQ(pieces("a   "), (V{"a", "   "}));      // trailing whitespace stays whole
  EXPECT_EQ(pieces("a\tb"), (V{"a", "\t", "b"}));  // only U+0020 joins the next word
  EXPECT_EQ(pieces("a \n b"), (V{"a", " \n", " b"}));
  EXPECT_EQ(pieces(" !!"), (V{" !!"}));
  EXPECT_EQ(pieces(" "), (V{" "}));
  EXPECT_EQ(pieces(""), (V{}));
  EXPECT_EQ(pieces("\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C"), (V{"\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C"}));
  EXPECT_EQ(pieces("Cafe\xCC\x81s"), (V{"Cafe", "\xCC\x81", "s"}));  // combining mark is not \p{L}
  // tiktoken writes the whitespace branches \s++$|\s+(?!\S)|\s: the same pieces.
  EXPECT_EQ(pieces("x\xC2\x85\xC2\x85y"), (V{"x", "\xC2\x85", "\xC2\x85", "y"}));  // U+0085 is \s
  EXPECT_EQ(pieces(" \xEF\xBB\xBFz"), (V{" \xEF\xBB\xBF", "z"}));                  // U+FEFF is not
  EXPECT_EQ(pieces("a \t\n"), (V{"a", " \t\n"}));
}

// The pieces of BLOOM's pre-tokenizer: its Split, then ByteLevel without regex.
std::vector<std::string> bloom_pieces(const std::string& utf8) {
  const json split = {{"type", "Split"}, {"pattern", {{"Regex", kBloomSplitPattern}}}, {"behavior", "Isolated"}};
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  static const PreTokenizer bloom =
      PreTokenizer::from_json({{"type", "Sequence"}, {"pretokenizers", json::array({split, byte_level})}}, "bloom");
  std::vector<std::string> out;
  bloom.split(utf8, out);
  return out;
}

// \s is White_Space as in Hugging Face's Oniguruma (JavaScript's \s, which
// gpt-3-encoder used, has U+FEFF and lacks U+0085).
TEST(TokenizerPretokenizer, HuggingFaceWhiteSpaceHasNextLineNotByteOrderMark) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("a\u0085b \uFEFFc"), (V{"a", "\u0085", "b", " \uFEFF", "c"}));
}

TEST(TokenizerPretokenizer, SplitsLikeBloomRegex) {
  using V = std::vector<std::string>;
  EXPECT_EQ(bloom_pieces("Hello, world!"), (V{"Hello", ",", " world", "!"}));
  EXPECT_EQ(bloom_pieces("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(bloom_pieces("a ,b"), (V{"a", " ,", "b"}));  // separators between words form one piece
  EXPECT_EQ(bloom_pieces("  x...  "), (V{" ", " x", "...  "}));
  EXPECT_EQ(bloom_pieces("I'm 3.5 [ok] (no|yes)"), (V{"I'm", " 3", ".", "5", " [ok]", " (", "no", "|", "yes", ")"}));
  EXPECT_EQ(bloom_pieces("\xE4\xBD\xA0\xE3\x80\x82\xE5\xA5\xBD"), (V{"\xE4\xBD\xA0", "\xE3\x80\x82", "\xE5\xA5\xBD"}));
  EXPECT_EQ(bloom_pieces("a\xC2\x85"
                         "b"),
            (V{"a", "\xC2\x85", "b"}));  // U+0085 is \s to Oniguruma
  EXPECT_EQ(bloom_pieces(""), (V{}));
}

// --- Golden ids from tiktoken ------------------------------------------------------

TEST(TokenizerGolden, KnownGpt2Facts) {
  REQUIRE_GPT2();
  const Tokenizer& t = *gpt2();
  EXPECT_EQ(t.id_count(), 50257u);
  EXPECT_EQ(t.encode("Hello world"), (std::vector<TokenId>{15496, 995}));
  EXPECT_EQ(t.token_id("<|endoftext|>"), TokenId{50256});
  EXPECT_EQ(t.token_id("\xC4\xA0the"), TokenId{262});  // " the" (Ġ is the byte character of ' ')
  ASSERT_EQ(t.added_tokens().size(), 1u);
  EXPECT_EQ(t.decode({50256}), "<|endoftext|>");
  EXPECT_EQ(t.encode(""), std::vector<TokenId>{});
}

TEST(TokenizerGolden, MatchesTiktokenOnTrickyStrings) {
  REQUIRE_GPT2();
  const json golden = json::parse(read_bytes(kDataDir + "/golden.json"));
  const auto& cases = golden.at("cases");
  ASSERT_GE(cases.size(), 40u);
  int valid_utf8 = 0;
  for (const auto& c : cases) {
    const std::string text = from_hex(c.at("hex").get<std::string>());
    const auto expected = c.at("ids").get<std::vector<TokenId>>();
    const auto ids = gpt2()->encode(text);
    EXPECT_EQ(ids, expected) << "case " << c.at("name").get<std::string>();
    // Decoding gives back the text, with invalid bytes replaced by U+FFFD.
    const std::string replaced = to_utf8(decode_utf8(text));
    EXPECT_EQ(gpt2()->decode(ids), replaced) << "case " << c.at("name").get<std::string>();
    valid_utf8 += replaced == text;
  }
  EXPECT_LT(valid_utf8, static_cast<int>(cases.size()));  // some cases are invalid UTF-8
}

// --- The .tiktoken format ------------------------------------------------------------

// GPT-2's spelling of bytes as text (encoder.json's keys, vocab.bpe's merges).
std::string byte_characters(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, byte_to_unicode()[b]);
  return out;
}

// encoder.json's vocabulary and vocab.bpe's merges (in byte characters) of the
// GPT-2 directory: derived from its gpt2.tiktoken (what tiktoken_merges
// computes), or read from its encoder.json and vocab.bpe if it holds those
// instead. Computed once.
struct Gpt2Files {
  json vocab;
  std::vector<std::pair<std::string, std::string>> merges;
};

const Gpt2Files& gpt2_files() {
  static const Gpt2Files files = [] {
    Gpt2Files f;
    if (fs::exists(gpt2_tiktoken_path())) {
      const auto tokens = parse_tiktoken_ranks(read_bytes(gpt2_tiktoken_path()), "gpt2.tiktoken");
      std::map<TokenId, std::string> bytes_of;
      f.vocab = json::object();
      for (const TiktokenToken& t : tokens) {
        f.vocab[byte_characters(t.bytes)] = t.rank;
        bytes_of[t.rank] = t.bytes;
      }
      f.vocab[kGpt2EndOfText] = kGpt2EndOfTextId;
      for (const auto& m : tiktoken_merges(tokens, "gpt2.tiktoken")) {
        f.merges.emplace_back(byte_characters(bytes_of.at(m.left)), byte_characters(bytes_of.at(m.right)));
      }
    } else {
      f.vocab = json::parse(read_bytes(gpt2_dir() + "/encoder.json"));
      const auto lines = split_lines(read_bytes(gpt2_dir() + "/vocab.bpe"));
      for (std::size_t i = 1; i < lines.size(); ++i) {
        const std::string& m = lines[i];
        if (!m.empty()) f.merges.emplace_back(m.substr(0, m.find(' ')), m.substr(m.find(' ') + 1));
      }
    }
    return f;
  }();
  return files;
}

TEST(TokenizerTiktoken, LoadsGpt2FromTheFileOrItsDirectory) {
  REQUIRE_GPT2_TIKTOKEN();
  const auto start = std::chrono::steady_clock::now();
  const Tokenizer from_file = Tokenizer::load(gpt2_tiktoken_path());
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[ tiktoken ] " << gpt2_tiktoken_path() << " loaded in " << load_ms << " ms\n";
  EXPECT_EQ(from_file.source(), gpt2_tiktoken_path());
  EXPECT_EQ(from_file.id_count(), 50257u);
  EXPECT_EQ(from_file.encode("Hello world"), (std::vector<TokenId>{15496, 995}));
  EXPECT_EQ(from_file.token_id("<|endoftext|>"), TokenId{50256});
  EXPECT_EQ(from_file.token_id("\xC4\xA0the"), TokenId{262});
  ASSERT_EQ(from_file.added_tokens().size(), 1u);
  EXPECT_EQ(from_file.added_tokens()[0].content, "<|endoftext|>");
  EXPECT_TRUE(from_file.added_tokens()[0].special);
  EXPECT_EQ(from_file.decode({50256, 15496}), "<|endoftext|>Hello");
  // As tiktoken's encode_ordinary: <|endoftext|> in the text is plain text.
  EXPECT_EQ(from_file.encode("<|endoftext|>"), (std::vector<TokenId>{27, 91, 437, 1659, 5239, 91, 29}));

  // A directory holding gpt2.tiktoken (and a leftover of another format) loads it.
  TempDir dir;
  fs::copy_file(gpt2_tiktoken_path(), dir.path() / "gpt2.tiktoken");
  write_bytes(dir.path() / "vocab.bpe", "not read\n");
  const Tokenizer from_dir = Tokenizer::load(dir.path().string());
  EXPECT_EQ(from_dir.source(), (dir.path() / "gpt2.tiktoken").string());
  EXPECT_EQ(from_dir.encode(" the end"), from_file.encode(" the end"));
}

// The merges derived from the ranks are vocab.bpe's: GPT-2's original files,
// written from them, load into a tokenizer with the same ids.
TEST(TokenizerTiktoken, DerivedMergesAreGpt2sVocabBpe) {
  REQUIRE_GPT2_TIKTOKEN();
  const auto tokens = parse_tiktoken_ranks(read_bytes(gpt2_tiktoken_path()), "gpt2.tiktoken");
  ASSERT_EQ(tokens.size(), 50256u);
  EXPECT_EQ(tokens.front().rank, 0);
  EXPECT_EQ(tokens.front().bytes, "!");
  EXPECT_EQ(tokens.back().rank, 50255);
  const auto merges = tiktoken_merges(tokens, "gpt2.tiktoken");
  ASSERT_EQ(merges.size(), 50000u);
  // vocab.bpe's first lines are "Ġ t", "Ġ a", "h e"; its last is "Ġg azed".
  EXPECT_EQ(merges[0].left, 220);  // " "
  EXPECT_EQ(merges[0].right, 83);  // "t"
  EXPECT_EQ(merges[0].merged, 256);
  EXPECT_EQ(merges[2].left, 71);   // "h"
  EXPECT_EQ(merges[2].right, 68);  // "e"
  EXPECT_EQ(merges.back().merged, 50255);
  const Gpt2Files& files = gpt2_files();
  ASSERT_EQ(files.merges.size(), 50000u);
  EXPECT_EQ(files.merges.back(), std::make_pair(std::string("\xC4\xA0g"), std::string("azed")));

  TempDir dir;
  write_bytes(dir.path() / "encoder.json", files.vocab.dump());
  std::string vocab_bpe = "#version: 0.2\n";
  for (const auto& [left, right] : files.merges) vocab_bpe += left + " " + right + "\n";
  write_bytes(dir.path() / "vocab.bpe", vocab_bpe);
  const Tokenizer original = Tokenizer::load(dir.path().string());
  const Tokenizer tiktoken = Tokenizer::load(gpt2_tiktoken_path());
  EXPECT_EQ(original.id_count(), tiktoken.id_count());
  std::size_t lines = 0, mismatches = 0;
  for (const std::string& line : split_lines(read_bytes(kDataDir + "/corpus.txt"))) {
    ++lines;
    if (original.encode(line) != tiktoken.encode(line) && ++mismatches <= 5)
      ADD_FAILURE() << "corpus line " << lines << " encodes differently";
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(original.decode({50256, 15496}), tiktoken.decode({50256, 15496}));
}

// A .tiktoken file's text from (bytes, rank) pairs, one line each.
std::string tiktoken_text(const std::vector<std::pair<std::string, int>>& tokens) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string text;
  for (const auto& [bytes, rank] : tokens) {
    for (std::size_t i = 0; i < bytes.size(); i += 3) {
      std::uint32_t bits = 0;
      const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
      for (std::size_t k = 0; k < 3; ++k) bits = (bits << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
      for (std::size_t k = 0; k < 4; ++k) text += k <= n ? kAlphabet[(bits >> (18 - 6 * k)) & 63] : '=';
    }
    text += " " + std::to_string(rank) + "\n";
  }
  return text;
}

// The 256 single bytes, byte b with rank b, then the given tokens.
std::string small_tiktoken_text(const std::vector<std::pair<std::string, int>>& more) {
  std::vector<std::pair<std::string, int>> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(std::string(1, static_cast<char>(b)), b);
  tokens.insert(tokens.end(), more.begin(), more.end());
  return tiktoken_text(tokens);
}

TEST(TokenizerTiktoken, SmallFileRanksAreMergePriorities) {
  TempDir dir;
  const fs::path file = dir.path() / "small.tiktoken";
  // "hi" (256) comes before " h" (257): " hi" is " " + "hi".
  write_bytes(file, small_tiktoken_text({{"hi", 256}, {" h", 257}, {" hi", 258}, {"hih", 259}}));
  EXPECT_EQ(tiktoken_text({{"a", 1}, {"ab", 2}, {"abc", 3}, {"\xFF", 4}}), "YQ== 1\nYWI= 2\nYWJj 3\n/w== 4\n");
  const auto tokens = parse_tiktoken_ranks(read_bytes(file.string()), file.string());
  const auto merges = tiktoken_merges(tokens, file.string());
  ASSERT_EQ(merges.size(), 4u);
  EXPECT_EQ(merges[0].left, 'h');
  EXPECT_EQ(merges[0].right, 'i');
  EXPECT_EQ(merges[2].left, ' ');
  EXPECT_EQ(merges[2].right, 256);
  EXPECT_EQ(merges[3].left, 256);  // "hi" + "h": BPE of "hih" merges "hi" first
  EXPECT_EQ(merges[3].right, 'h');

  const Tokenizer t = Tokenizer::load(file.string());
  EXPECT_EQ(t.id_count(), 50257u);  // <|endoftext|> is 50256 whatever the file's size
  EXPECT_EQ(t.encode("hi"), (std::vector<TokenId>{256}));
  EXPECT_EQ(t.encode(" hi"), (std::vector<TokenId>{258}));
  EXPECT_EQ(t.encode(" ih"), (std::vector<TokenId>{' ', 'i', 'h'}));
  // Not "hih" + "i": BPE merges "hi" and "hi" first, and "hi" + "hi" is no token.
  EXPECT_EQ(t.encode("hihi"), (std::vector<TokenId>{256, 256}));
  EXPECT_EQ(t.encode(" h."), (std::vector<TokenId>{257, '.'}));
  EXPECT_EQ(t.decode({258, 50256, 0xFF}), " hi<|endoftext|>\xFF");
  EXPECT_ONE_LINE_ERROR(t.decode({300}), "token id 300 is not in the vocabulary of " + file.string());

  // Not BPE ranks: "abc" cannot be made from two tokens of lower rank.
  write_bytes(file, small_tiktoken_text({{"abc", 256}}));
  EXPECT_EQ(error_of([&] { Tokenizer::load(file.string()); }),
            "tokenizer file " + file.string() +
                " line 257: the token of rank 256 (3 bytes) is not two tokens of lower rank "
                "merged: BPE by the lower ranks leaves 3 parts of it (the ranks are not BPE merge "
                "priorities)");
  // A byte without a token of its own.
  write_bytes(file, tiktoken_text({{"a", 0}, {"b", 1}, {"ab", 2}, {"ac", 3}}));
  EXPECT_EQ(
      error_of([&] { Tokenizer::load(file.string()); }),
      "tokenizer file " + file.string() + " line 4: the token of rank 3 has byte 0x63, which has no token of its own");
  write_bytes(file, tiktoken_text({{"a", 0}, {"b", 1}, {"ab", 2}}));
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(file.string()).encode("abc"), "has no token for byte 0x63");
}

TEST(TokenizerTiktoken, MalformedLinesAreOneLineErrorsNamingFileAndLine) {
  TempDir dir;
  const fs::path file = dir.path() / "bad.tiktoken";
  const std::string prefix = "tokenizer file " + file.string();
  // The message of loading a file with this text.
  const auto error = [&](const std::string& text) {
    write_bytes(file, text);
    const std::string message = error_of([&] { Tokenizer::load(file.string()); });
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  };
  EXPECT_EQ(error("IQ== 0\nI!== 1\n"), prefix + " line 2: token \"I!==\" is not valid base64");
  EXPECT_EQ(error("IQ= 0\n"), prefix + " line 1: token \"IQ=\" is not valid base64");
  EXPECT_EQ(error("IR== 0\n"), prefix + " line 1: token \"IR==\" is not valid base64");
  EXPECT_EQ(error("I=Q= 0\n"), prefix + " line 1: token \"I=Q=\" is not valid base64");
  EXPECT_EQ(error("\xFF\tA 0\n"), prefix + " line 1: token \"\\xFF\\x09A\" is not valid base64");
  EXPECT_EQ(error("IQ== 0\n\nIg==\n"), prefix + " line 3: no rank: expected \"<base64 token> <rank>\", got \"Ig==\"");
  EXPECT_EQ(error("IQ== \n"), prefix + " line 1: no rank: expected \"<base64 token> <rank>\", got \"IQ== \"");
  EXPECT_EQ(error(" 5\n"), prefix + " line 1: the token before the rank is empty");
  EXPECT_EQ(error("IQ== 0\nIg== 1x\n"), prefix + " line 2: rank \"1x\" is not a non-negative integer");
  EXPECT_EQ(error("IQ== -1\n"), prefix + " line 1: rank \"-1\" is not a non-negative integer");
  EXPECT_EQ(error("IQ== 1 2\n"), prefix + " line 1: rank \"1 2\" is not a non-negative integer");
  EXPECT_EQ(error("IQ== 99999999999\n"), prefix + " line 1: rank \"99999999999\" is too large (above 2147483646)");
  EXPECT_EQ(error("IQ== 50256\n"), prefix +
                                       " line 1: rank 50256 is GPT-2's <|endoftext|> id, which a .tiktoken file "
                                       "must leave free (only GPT-2's vocabulary is supported)");
  EXPECT_EQ(error("IQ== 0\nIg== 1\nIw== 0\nJA== 1\n"), prefix + " line 3: rank 0 is already the rank of line 1");
  EXPECT_EQ(error("IQ== 0\nIg== 1\nIQ== 2\nIg== 1\n"), prefix + " line 3: token \"IQ==\" is already on line 1");
  EXPECT_EQ(error("\n\r\n"), prefix + " has no tokens");
  // CRLF line ends and empty lines are fine, as in tiktoken's loader.
  write_bytes(file, "IQ== 0\r\n\r\nIg== 1\r\n");
  EXPECT_EQ(Tokenizer::load(file.string()).encode("!\""), (std::vector<TokenId>{0, 1}));

  EXPECT_ONE_LINE_ERROR(Tokenizer::load((dir.path() / "absent.tiktoken").string()),
                        "tokenizer path " + (dir.path() / "absent.tiktoken").string() + " does not exist");
  fs::create_directories(dir.path() / "d" / "gpt2.tiktoken");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load((dir.path() / "d").string()),
                        "tokenizer file " + (dir.path() / "d" / "gpt2.tiktoken").string() + " is a directory");
}

// --- Live comparison with tiktoken -------------------------------------------------

#define REQUIRE_TIKTOKEN_REFERENCE()                                                         \
  ASSERT_TRUE(have_tiktoken()) << "tiktoken is not installed in the venv (" << venv_python() \
                               << "): run scripts/setup.sh, or set GRADACCUM_VENV"

// Encodes every line of a file here and with tiktoken (reference_encode.py,
// GPT-2's encoding built offline from the same GPT-2 directory); returns the
// number of lines whose ids differ (each reported as a failure).
std::size_t compare_with_tiktoken(const std::string& path, const std::string& what, const fs::path& dir) {
  const auto result =
      run("'" + venv_python() + "' -B '" + kDataDir + "/reference_encode.py' '" + gpt2_dir() + "' '" + path + "'", dir);
  EXPECT_EQ(result.status, 0) << result.err;
  const auto lines = split_lines(read_bytes(path));
  const auto reference = split_lines(result.out);
  EXPECT_EQ(reference.size(), lines.size());
  if (reference.size() != lines.size()) return lines.size();
  std::size_t mismatches = 0, tokens = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto expected = json::parse(reference[i]).get<std::vector<TokenId>>();
    const auto ids = gpt2()->encode(lines[i]);
    tokens += expected.size();
    if (ids != expected && ++mismatches <= 20) {
      ADD_FAILURE() << what << " line " << i + 1 << ": " << json(ids).dump() << " != tiktoken's " << reference[i];
    }
  }
  std::cout << "[ " << what << " ] " << lines.size() << " lines, " << tokens << " tokens compared with tiktoken, "
            << mismatches << " mismatching lines\n";
  return mismatches;
}

TEST(TokenizerReference, CorpusMatchesTiktoken) {
  REQUIRE_GPT2();
  REQUIRE_TIKTOKEN_REFERENCE();
  const std::string corpus = kDataDir + "/corpus.txt";
  ASSERT_GE(split_lines(read_bytes(corpus)).size(), 400u);
  TempDir dir;
  EXPECT_EQ(compare_with_tiktoken(corpus, "corpus", dir.path()), 0u);
}

// The whole KJV, verse by verse, as the kjv data sets tokenize it (the text
// after each verse reference).
TEST(TokenizerReference, KjvMatchesTiktoken) {
  REQUIRE_GPT2();
  REQUIRE_TIKTOKEN_REFERENCE();
  std::string text;
  for (const Verse& v : load_kjv()) text += v.text + "\n";
  TempDir dir;
  const std::string path = (dir.path() / "kjv.txt").string();
  write_bytes(path, text);
  ASSERT_EQ(split_lines(text).size(), static_cast<std::size_t>(kKjvVerses));
  EXPECT_EQ(compare_with_tiktoken(path, "kjv", dir.path()), 0u);
}

// Short random strings over an alphabet chosen to meet every branch of the
// pre-tokenizer regex: contractions, each class after a space or not,
// whitespace runs of every kind before a non-space or at the end, invalid bytes;
// then a few long runs of letters.
TEST(TokenizerReference, RandomRegexEdgeCasesMatchTiktoken) {
  REQUIRE_GPT2();
  REQUIRE_TIKTOKEN_REFERENCE();
  const std::vector<std::string> alphabet = {" ",
                                             " ",
                                             " ",
                                             "\t",
                                             "\r",
                                             "\v",
                                             "\f",
                                             "\xC2\xA0",
                                             "\xC2\x85",
                                             "\xEF\xBB\xBF",
                                             "\xE2\x80\xA8",
                                             "\xE3\x80\x80",
                                             "'",
                                             "'",
                                             "s",
                                             "t",
                                             "re",
                                             "ve",
                                             "m",
                                             "ll",
                                             "d",
                                             "S",
                                             "a",
                                             "Z",
                                             "\xC3\xA9",
                                             "\xE4\xB8\xAD",
                                             "1",
                                             "9",
                                             "\xC2\xBD",
                                             "\xD9\xA3",
                                             "!",
                                             ".",
                                             "_",
                                             "-",
                                             "\xCC\x81",
                                             "\xF0\x9F\x98\x80",
                                             "\xE2\x80\x8B",
                                             "\xFF",
                                             "\x80",
                                             "\xE2\x82",
                                             "\x00"};
  std::mt19937 rng(20240517);
  std::string text;
  const int kLines = 3000;
  for (int i = 0; i < kLines; ++i) {
    const std::size_t length = 1 + rng() % 12;
    for (std::size_t j = 0; j < length; ++j) text += alphabet[rng() % alphabet.size()];
    text += '\n';
  }
  // Long pieces (one \p{L}+ run) take the heap merge path of ByteLevelBpe.
  const std::vector<std::string> letters = {"a", "e", "n", "t", "s", "Q", "\xC3\xA9", "\xE4\xB8\xAD"};
  for (int i = 0; i < 20; ++i) {
    const std::size_t length = 100 + rng() % 3000;
    for (std::size_t j = 0; j < length; ++j) text += letters[rng() % letters.size()];
    text += '\n';
  }
  TempDir dir;
  const std::string path = (dir.path() / "random.txt").string();
  write_bytes(path, text);
  EXPECT_EQ(compare_with_tiktoken(path, "random", dir.path()), 0u);
}

// Every code point's class (with \s as the tokenizers use it, White_Space)
// against the Python `regex` module (classify_code_points.py; tiktoken's own
// Rust regex cannot be asked from Python). Its Unicode may be newer than the
// generated tables (14.0): code points assigned since are kOther here and may
// be letters, digits or spaces there. Any other difference fails.
TEST(TokenizerReference, UnicodeClassesMatchPythonRegexUpToNewerAssignments) {
  REQUIRE_TIKTOKEN_REFERENCE();  // the regex module comes with tiktoken
  TempDir dir;
  const auto result = run("'" + venv_python() + "' -B '" + kDataDir + "/classify_code_points.py'", dir.path());
  ASSERT_EQ(result.status, 0) << result.err;
  ASSERT_EQ(result.out.size(), 0x110000u);
  std::size_t newer = 0, conflicts = 0;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    const char python = result.out[cp];
    const char ours = "0sLN"[static_cast<int>(char_class(cp, SpaceDefinition::kUnicodeWhiteSpace))];
    if ((ours == '0' ? '.' : ours) == python) continue;
    if (ours == '0') {
      ++newer;
    } else if (++conflicts <= 20) {
      ADD_FAILURE() << "U+" << std::hex << static_cast<unsigned>(cp) << ": ours " << ours << ", Python's regex "
                    << python;
    }
  }
  std::cout << "[ unicode  ] tables " << kUnicodeTablesVersion << ": " << newer
            << " code points are letters/digits/spaces only in the regex module's newer Unicode\n";
  EXPECT_EQ(conflicts, 0u);
}

// --- tokenizer.json -----------------------------------------------------------------

std::string byte_char(int b) {
  std::string s;
  append_utf8(s, byte_to_unicode()[b]);
  return s;
}

// A small tokenizer.json shaped like BLOOM's vocabulary: special tokens first,
// then the 256 byte characters, then three merges given as pairs.
json tiny_tokenizer_json() {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  vocab["<pad>"] = 3;
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = 4 + b;
  const std::string G = byte_char(' ');  // "Ġ"
  vocab["hi"] = 260;
  vocab[G + "h"] = 261;
  vocab[G + "hi"] = 262;
  json added = json::array();
  for (const char* t : {"<unk>", "<s>", "</s>", "<pad>"}) {
    added.push_back({{"id", vocab[t]}, {"content", t}, {"special", true}, {"normalized", false}});
  }
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", "<unk>"},
            {"vocab", vocab},
            {"merges", json::array({json::array({"h", "i"}), json::array({G, "h"}), json::array({G + "h", "i"})})}}}};
}

TEST(TokenizerHfJson, SmallFileWithAddedTokensAndPairMerges) {
  TempDir dir;
  const json config = tiny_tokenizer_json();
  write_bytes(dir.path() / "tokenizer.json", config.dump());
  const Tokenizer t = Tokenizer::load(dir.path().string());
  const TokenId G = 4 + ' ', h = 4 + 'h', i = 4 + 'i';
  EXPECT_EQ(t.added_tokens().size(), 4u);
  EXPECT_EQ(t.id_count(), 263u);
  EXPECT_EQ(t.encode("hi"), (std::vector<TokenId>{260}));
  // Ranks decide: "h i" (rank 0) merges before "Ġ h" (rank 1), leaving Ġ + hi;
  // "Ġh i" never applies. "ih" has no merge.
  EXPECT_EQ(t.encode(" hi"), (std::vector<TokenId>{G, 260}));
  EXPECT_EQ(t.encode(" ih"), (std::vector<TokenId>{G, i, h}));
  // Added tokens found in the text become their ids.
  EXPECT_EQ(t.encode("<pad>hi</s><s>"), (std::vector<TokenId>{3, 260, 2, 1}));
  EXPECT_EQ(t.encode("</s </s>"), (std::vector<TokenId>{4 + '<', 4 + '/', 4 + 's', G, 2}));
  EXPECT_EQ(t.decode({3, 260, G, 2}), "<pad>hi </s>");

  json prefixed = config;
  prefixed["pre_tokenizer"]["add_prefix_space"] = true;
  write_bytes(dir.path() / "prefixed.json", prefixed.dump());
  EXPECT_EQ(Tokenizer::load((dir.path() / "prefixed.json").string()).encode("hi"), (std::vector<TokenId>{G, 260}));
}

// A tokenizer.json from one of the *.template.json files here, filled with
// GPT-2's vocabulary as gen_hf_golden.py does (encoder.json's vocabulary and
// vocab.bpe's merges as gpt2.tiktoken implies them): merges as "a b" strings
// for hf_gpt2, as ["a", "b"] pairs for the others.
fs::path write_hf_tokenizer(const std::string& name, const fs::path& dir) {
  json config = json::parse(read_bytes(kDataDir + "/" + name + ".template.json"));
  config["model"]["vocab"] = gpt2_files().vocab;
  json merges = json::array();
  for (const auto& [left, right] : gpt2_files().merges) {
    if (name == "hf_gpt2") {
      merges.push_back(left + " " + right);
    } else {
      merges.push_back({left, right});
    }
  }
  config["model"]["merges"] = std::move(merges);
  const fs::path path = dir / (name + ".json");
  write_bytes(path, config.dump());
  return path;
}

// Ids from Hugging Face tokenizers (gen_hf_golden.py) for GPT-2's vocabulary
// under GPT-2's pre-tokenizer and under BLOOM's (with and without
// add_prefix_space), on the tricky strings, added tokens and corpus lines.
TEST(TokenizerHfJson, MatchesHuggingFaceTokenizers) {
  REQUIRE_GPT2();
  TempDir dir;
  const json golden = json::parse(read_bytes(kDataDir + "/hf_golden.json"));
  const auto corpus = split_lines(read_bytes(kDataDir + "/corpus.txt"));
  std::map<std::string, Tokenizer> tokenizers;
  std::size_t compared = 0;
  for (const auto& c : golden.at("cases")) {
    const std::string name = c.at("tokenizer").get<std::string>();
    if (tokenizers.count(name) == 0) {
      tokenizers.emplace(name, Tokenizer::load(write_hf_tokenizer(name, dir.path()).string()));
    }
    const std::string text = c.contains("hex") ? from_hex(c.at("hex").get<std::string>())
                                               : corpus.at(c.at("corpus_line").get<std::size_t>() - 1);
    EXPECT_EQ(tokenizers.at(name).encode(text), c.at("ids").get<std::vector<TokenId>>())
        << name << " case " << c.at("name").get<std::string>();
    ++compared;
  }
  EXPECT_EQ(tokenizers.size(), 3u);
  EXPECT_GE(compared, 300u);
  // <|endoftext|> is an added token there, plain text to tiktoken's encode_ordinary.
  EXPECT_EQ(tokenizers.at("hf_gpt2").encode("a<|endoftext|>b"), (std::vector<TokenId>{64, 50256, 65}));
  const auto plain = gpt2()->encode("a<|endoftext|>b");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), TokenId{50256}), 0);
  EXPECT_EQ(tokenizers.at("hf_bloom").decode({50257, 15496, 50258}), "<pad>Hello</s>");
  EXPECT_EQ(tokenizers.at("hf_bloom").token_id("</s>"), TokenId{50258});  // added, not in the vocab
  EXPECT_EQ(tokenizers.at("hf_bloom").id_count(), 50259u);
}

// --- Bad input --------------------------------------------------------------------

TEST(TokenizerErrors, MissingOrMalformedFilesNameTheFile) {
  TempDir dir;
  const fs::path d = dir.path();
  EXPECT_ONE_LINE_ERROR(Tokenizer::load((d / "nowhere").string()), (d / "nowhere").string() + " does not exist");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()),
                        "holds none of tokenizer.json, gpt2.tiktoken, or encoder.json and vocab.bpe");

  write_bytes(d / "vocab.bpe", "#version: 0.2\nh i\n");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()), "cannot open tokenizer file " + (d / "encoder.json").string());

  write_bytes(d / "encoder.json", "{\"h\": 0, \"i\": 1,\n \"hi\" 2}");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()), (d / "encoder.json").string() + " is not valid JSON");
  write_bytes(d / "encoder.json", "{\"h\": 0, \"i\": \"one\"}");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()), "the id of token \"i\" is not an integer");

  write_bytes(d / "encoder.json", "{\"h\": 0, \"i\": 1, \"hi\": 2}");
  write_bytes(d / "vocab.bpe", "#version: 0.2\nh i\nhi\n");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()), (d / "vocab.bpe").string() + " line 3: expected two tokens");
  write_bytes(d / "vocab.bpe", "#version: 0.2\nh x\n");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()), "uses a token missing from the vocabulary ('x')");
  write_bytes(d / "vocab.bpe", "#version: 0.2\nh i\n");
  const Tokenizer tiny = Tokenizer::load(d.string());
  EXPECT_ONE_LINE_ERROR(tiny.encode("hi!"), "has no token for byte 0x21");
  EXPECT_ONE_LINE_ERROR(tiny.decode({7}), "token id 7 is not in the vocabulary");

  const fs::path tj = d / "tokenizer.json";
  write_bytes(tj, "");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()), tj.string() + " is not valid JSON");
  json config = tiny_tokenizer_json();
  config["model"]["type"] = "WordPiece";
  write_bytes(tj, config.dump());
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(tj.string()), tj.string() + ": model type WordPiece is not supported");
  config = tiny_tokenizer_json();
  config["model"]["merges"][1] = "a b c";
  write_bytes(tj, config.dump());
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(tj.string()), "model.merges[1] is not two tokens");
  // A field of the wrong JSON type (a fuzzer finding: a numeric model type).
  config = tiny_tokenizer_json();
  config["model"]["type"] = 5;
  write_bytes(tj, config.dump());
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(tj.string()),
                        tj.string() + ": unexpected JSON structure ([json.exception.type_error.302]");
  config = tiny_tokenizer_json();
  config["normalizer"] = {{"type", "BertNormalizer"}};
  write_bytes(tj, config.dump());
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(tj.string()), "normalizer BertNormalizer is not supported");
  // A Split of any expression PCRE2 compiles is supported; one it cannot compile is named.
  config = tiny_tokenizer_json();
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  config["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array(
           {{{"type", "Split"}, {"pattern", {{"Regex", kBloomSplitPattern}}}, {"behavior", "Isolated"}}, byte_level})}};
  write_bytes(tj, config.dump());
  EXPECT_EQ(Tokenizer::load(tj.string()).encode("hi, hi"), (std::vector<TokenId>{260, 4 + ',', 4 + ' ', 260}));
  config["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  write_bytes(tj, config.dump());
  EXPECT_EQ(Tokenizer::load(tj.string()).encode("hi, hi"), (std::vector<TokenId>{260, 4 + ',', 4 + ' ', 260}));
  config["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(?<=a+)b";
  write_bytes(tj, config.dump());
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(tj.string()),
                        tj.string() +
                            ": pre_tokenizer Split pattern \"(?<=a+)b\" does not compile: lookbehind "
                            "assertion is not fixed length");
  config["pre_tokenizer"]["pretokenizers"] = json::array({{{"type", "Metaspace"}}, byte_level});
  write_bytes(tj, config.dump());
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(tj.string()), "pre_tokenizer step Metaspace is not supported");
  config = tiny_tokenizer_json();
  config.erase("model");
  write_bytes(tj, config.dump());
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(tj.string()), tj.string() + " has no \"model\" object");
}

// --- The CLI ------------------------------------------------------------------------

TEST(TokenizerCli, EncodesLinesAndDecodesThemBack) {
  REQUIRE_GPT2();
  TempDir dir;
  const std::string cli = std::string("'") + GRADACCUM_CLI + "' tokenize --tokenizer '" + gpt2_dir() + "' ";
  write_bytes(dir.path() / "in.txt", "Hello world\n\nI'm here  \xF0\x9F\x98\x80\n");
  const auto encoded = run(cli + "'" + (dir.path() / "in.txt").string() + "'", dir.path());
  ASSERT_EQ(encoded.status, 0) << encoded.err;
  const auto lines = split_lines(encoded.out);
  ASSERT_EQ(lines.size(), 3u) << encoded.out;
  EXPECT_EQ(lines[0], "[15496,995]");
  EXPECT_EQ(lines[1], "[]");
  EXPECT_EQ(json::parse(lines[2]).get<std::vector<TokenId>>(), gpt2()->encode("I'm here  \xF0\x9F\x98\x80"));

  write_bytes(dir.path() / "ids.txt", encoded.out);
  const auto decoded = run(cli + "--decode < '" + (dir.path() / "ids.txt").string() + "'", dir.path());
  ASSERT_EQ(decoded.status, 0) << decoded.err;
  EXPECT_EQ(decoded.out, "Hello world\n\nI'm here  \xF0\x9F\x98\x80\n");

  write_bytes(dir.path() / "bad_ids.txt", "[15496, \"x\"]\n");
  const auto bad = run(cli + "--decode '" + (dir.path() / "bad_ids.txt").string() + "'", dir.path());
  EXPECT_EQ(bad.status, 1);
  EXPECT_EQ(bad.err, "gradaccum: error: input line 1: \"x\" is not a token id\n");
}

TEST(TokenizerCli, MissingTokenizerIsAOneLineError) {
  TempDir dir;
  const std::string missing = (dir.path() / "absent").string();
  const auto result =
      run(std::string("echo hi | '") + GRADACCUM_CLI + "' tokenize --tokenizer '" + missing + "'", dir.path());
  EXPECT_EQ(result.status, 1);
  EXPECT_EQ(result.err, "gradaccum: error: tokenizer path " + missing + " does not exist\n");
  const auto env =
      run("echo hi | GRADACCUM_TOKENIZER_DIR='" + missing + "' '" + GRADACCUM_CLI + "' tokenize", dir.path());
  EXPECT_EQ(env.status, 1);
  EXPECT_NE(env.err.find(missing + " does not exist: run scripts/setup.sh"), std::string::npos) << env.err;
}

}  // namespace tokenizer_test

}  // namespace gradaccum::data
