// The tokenizer a GGUF file holds (data/gguf_tokenizer.h) against transformers' GGUF conversion
// (AutoTokenizer.from_pretrained(dir, gguf_file=name), run by tests/hf/gguf_transformers_reference.py
// with the venv's Python) and Hugging Face tokenizers (tests/fixtures/tokenizer/hf_reference_encode.py):
// the tokenizer.json gradaccum makes of a file is the one transformers writes for it, field for
// field, for small tokenizers gguf's GGUFWriter wrote (pre-tokenizers smollm, llama-bpe, qwen2;
// control and user-defined tokens; a token outside the byte characters) and for
// SmolLM2-135M-Instruct (installed by scripts/setup.sh; its tests skip without it); the ids
// equal tokenizers' with that tokenizer.json on the test corpus and the movie reviews; the
// tokenizer.json gradaccum writes loads in tokenizers with the same ids. Then the refusals.
#include "gradaccum/data/gguf_tokenizer.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf_reference.h"
#include "gradaccum/data/tokenizer.h"
#include "test_support.h"

namespace gradaccum::data {
namespace gguf_tokenizer_test {

namespace fs = std::filesystem;
using gradaccum::testing::error_of;
using nlohmann::json;
using Ids = std::vector<TokenId>;

using gradaccum::testing::kSmolLm2Path;
const std::string kMovieReviews = "/var/lib/gradaccum/data/movie-reviews/reviews.csv";
const std::string kTokenizerData = std::string(GRADACCUM_TEST_DATA) + "/tokenizer";
const char* const kCases[] = {"tok-smollm", "tok-llama-bpe", "tok-qwen2"};

std::string read_bytes(const std::string& path) { return gradaccum::testing::file_bytes(path); }

using gradaccum::testing::split_lines;

std::string python() { return "'" + gradaccum::testing::venv_program("python") + "' -B "; }

// Runs `command` with its output into DIR/out and DIR/log; the exit status.
int run(const std::string& command, const std::string& dir) {
  const int raw = std::system((command + " > '" + dir + "/out' 2> '" + dir + "/log'").c_str());
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

using Reference = gradaccum::testing::GgufReference;
using gradaccum::testing::run_gguf_reference;
// The small tokenizers (~10 s) and SmolLM2's tokenizer.json (~10 s), once per test process.
const Reference& synthetic() {
  static const Reference r = run_gguf_reference("gguf-tokenizers", "tokenizers");
  return r;
}
const Reference& smollm2() {
  static const Reference r =
      run_gguf_reference("gguf-smollm2-tokenizer", std::string("tokenizer '") + kSmolLm2Path + "'");
  return r;
}

json read_json(const std::string& path) { return json::parse(read_bytes(path)); }

// tokenizers' ids for each line of `text_file` with `tokenizer_json` (hf_reference_encode.py).
std::vector<Ids> tokenizers_ids(const std::string& tokenizer_json, const std::string& text_file) {
  const auto dir = gradaccum::testing::make_temp_dir("gguf-encode");
  const int status = run(
      python() + "'" + kTokenizerData + "/hf_reference_encode.py' '" + tokenizer_json + "' '" + text_file + "'", dir);
  EXPECT_EQ(status, 0) << read_bytes(dir + "/log");
  std::vector<Ids> ids;
  for (const auto& line : split_lines(read_bytes(dir + "/out"))) ids.push_back(json::parse(line).get<Ids>());
  fs::remove_all(dir);
  return ids;
}

// Lines where `tokenizer` and tokenizers (with `tokenizer_json`) disagree on `text_file`'s lines;
// the first few are reported.
size_t mismatched_lines(const Tokenizer& tokenizer, const std::string& tokenizer_json, const std::string& text_file) {
  const auto lines = split_lines(read_bytes(text_file));
  const auto expected = tokenizers_ids(tokenizer_json, text_file);
  EXPECT_EQ(expected.size(), lines.size());
  if (expected.size() != lines.size()) return lines.size();
  size_t mismatches = 0, tokens = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    tokens += expected[i].size();
    if (tokenizer.encode(lines[i]) != expected[i] && ++mismatches <= 5) {
      ADD_FAILURE() << text_file << " line " << i + 1 << ": " << json(tokenizer.encode(lines[i])).dump()
                    << " != tokenizers' " << json(expected[i]).dump();
    }
  }
  std::cout << "[ gguf ] " << tokenizer_json << ": " << lines.size() << " lines, " << tokens << " tokens, "
            << mismatches << " mismatches\n";
  return mismatches;
}

// Texts that meet the small tokenizers' added tokens and respelled token beside the corpus.
std::string special_texts(const std::string& dir) {
  const std::string path = dir + "/special.txt";
  std::ofstream(path, std::ios::binary) << "<|im_start|>the film<|im_end|>\n<think>God said</think>\n"
                                           "a b and ab <tool_call>12 the<pad>\n<|endoftext|><|endoftext|>\n"
                                           "It's 1999, isn't it?\n\n  \t spaces\r\n";
  return path;
}

TEST(GgufTokenizer, JsonIsTransformersConversion) {
  ASSERT_EQ(synthetic().error, "");
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    const auto ours = gguf_tokenizer_json(formats::GgufFile::open(synthetic().dir + "/" + name + ".gguf"));
    const auto theirs = read_json(synthetic().dir + "/" + name + "/tokenizer.json");
    EXPECT_EQ(ours, theirs);
    // Control tokens special, user-defined ones not; the one written with a space respelled.
    ASSERT_EQ(ours["added_tokens"].size(), 6u);
    EXPECT_EQ(ours["added_tokens"][3], (json{{"id", 3},
                                             {"content", "<tool_call>"},
                                             {"single_word", false},
                                             {"lstrip", false},
                                             {"rstrip", false},
                                             {"normalized", false},
                                             {"special", false}}));
    EXPECT_TRUE(
        ours["model"]["vocab"].contains("a\xC4\xA0"
                                        "b"));  // "aĠb"
  }
}

TEST(GgufTokenizer, SmallTokenizersGiveTokenizersIds) {
  ASSERT_EQ(synthetic().error, "");
  const auto dir = gradaccum::testing::make_temp_dir("gguf-small-ids");
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    const auto tokenizer = Tokenizer::load(synthetic().dir + "/" + name + ".gguf");
    const auto theirs = synthetic().dir + "/" + name + "/tokenizer.json";
    EXPECT_EQ(mismatched_lines(tokenizer, theirs, kTokenizerData + "/corpus.txt"), 0u);
    EXPECT_EQ(mismatched_lines(tokenizer, theirs, special_texts(dir)), 0u);
  }
  // The pre-tokenizers differ: GPT-2's keeps a run of digits whole (merged to one token), Llama 3's
  // cuts it in threes, Qwen2's into single digits.
  EXPECT_EQ(Tokenizer::load(synthetic().dir + "/tok-smollm.gguf").encode("1999").size(), 1u);
  EXPECT_EQ(Tokenizer::load(synthetic().dir + "/tok-llama-bpe.gguf").encode("1999").size(), 2u);
  EXPECT_EQ(Tokenizer::load(synthetic().dir + "/tok-qwen2.gguf").encode("1999").size(), 4u);
  EXPECT_EQ(Tokenizer::load(synthetic().dir + "/tok-smollm.gguf").encode("<|im_start|><think>"), (Ids{1, 4}));
}

TEST(GgufTokenizer, WrittenTokenizerJsonLoadsInTokenizersWithTheSameIds) {
  ASSERT_EQ(synthetic().error, "");
  const auto dir = gradaccum::testing::make_temp_dir("gguf-written");
  std::vector<std::string> paths;
  for (const char* name : kCases) paths.push_back(synthetic().dir + "/" + name + ".gguf");
  if (fs::exists(kSmolLm2Path)) paths.push_back(kSmolLm2Path);
  for (const auto& path : paths) {
    SCOPED_TRACE(path);
    const auto written = dir + "/" + fs::path(path).stem().string() + ".json";
    write_tokenizer_json(written, gguf_tokenizer_json(formats::GgufFile::open(path)));
    const auto from_gguf = Tokenizer::load(path);
    EXPECT_EQ(mismatched_lines(from_gguf, written, kTokenizerData + "/corpus.txt"), 0u);
    EXPECT_EQ(mismatched_lines(Tokenizer::load(written), written, special_texts(dir)), 0u);
    EXPECT_EQ(Tokenizer::load(written).id_count(), from_gguf.id_count());
  }
}

TEST(GgufTokenizer, SmolLm2IsTransformersConversion) {
  REQUIRE_SMOLLM2();
  ASSERT_EQ(smollm2().error, "");
  const auto ours = gguf_tokenizer_json(formats::GgufFile::open(kSmolLm2Path));
  EXPECT_EQ(ours, read_json(smollm2().dir + "/tokenizer/tokenizer.json"));
  EXPECT_EQ(ours["model"]["vocab"].size(), 49152u);
  EXPECT_EQ(ours["model"]["merges"].size(), 48900u);
  EXPECT_EQ(ours["added_tokens"].size(), 17u);
  EXPECT_EQ(ours["pre_tokenizer"],
            (json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}));
}

TEST(GgufTokenizer, SmolLm2GivesTokenizersIdsOnTheCorpusAndTheReviews) {
  REQUIRE_SMOLLM2();
  ASSERT_EQ(smollm2().error, "");
  const auto tokenizer = Tokenizer::load(kSmolLm2Path);
  EXPECT_EQ(tokenizer.encode("And God said, Let there be light: and there was light."),
            (Ids{3528, 1839, 1137, 28, 2959, 665, 325, 1420, 42, 284, 665, 436, 1420, 30}));
  EXPECT_EQ(tokenizer.encode("<|im_start|>user"), (Ids{1, 4093}));
  // 21 bytes have no token (0x13 among them): tokenizers leaves them out, and so does gradaccum.
  EXPECT_EQ(tokenizer.encode("a\x13"
                             "b c\x13"),
            (Ids{81, 82, 265}));
  EXPECT_EQ(tokenizer.id_count(), 49152u);
  const auto theirs = smollm2().dir + "/tokenizer/tokenizer.json";
  EXPECT_EQ(mismatched_lines(tokenizer, theirs, kTokenizerData + "/corpus.txt"), 0u);
  if (!fs::exists(kMovieReviews)) {
    GTEST_SKIP() << "the movie reviews are not installed at " << kMovieReviews
                 << " (scripts/setup.sh installs them); the corpus was compared";
  }
  const auto dir = gradaccum::testing::make_temp_dir("gguf-reviews");
  ASSERT_EQ(
      run(python() + "'" + kTokenizerData + "/hf_reference_encode.py' '" + theirs + "' --csv '" + kMovieReviews + "' 1",
          dir),
      0)
      << read_bytes(dir + "/log");
  const auto rows = split_lines(read_bytes(dir + "/out"));
  ASSERT_EQ(rows.size(), 1500u);
  size_t mismatches = 0, tokens = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto row = json::parse(rows[i]);
    const auto expected = row.at("ids").get<Ids>();
    tokens += expected.size();
    if (tokenizer.encode(row.at("text").get<std::string>()) != expected && ++mismatches <= 5) {
      ADD_FAILURE() << "review " << i + 1 << " differs";
    }
  }
  std::cout << "[ gguf ] SmolLM2 on the reviews: " << rows.size() << " reviews, " << tokens << " tokens, " << mismatches
            << " mismatches\n";
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(tokens, 1000000u);
}

TEST(GgufTokenizerErrors, AnUnknownPreTokenizerIsNamed) {
  ASSERT_EQ(synthetic().error, "");
  const auto path = synthetic().dir + "/bad-pre-tokenizer.gguf";
  EXPECT_EQ(error_of([&] { Tokenizer::load(path); }),
            path +
                ": tokenizer.ggml.pre is \"no-such-pre\", a pre-tokenizer gradaccum does not know (known: gpt-2, "
                "smollm, llama-bpe, llama3, llama-v3, smaug-bpe, dbrx, falcon3, qwen2, deepseek-r1-qwen, megrez)");
  const auto r = gradaccum::testing::run_cli("tokenize --tokenizer " + path + " /dev/null");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("gradaccum: error: " + path + ": tokenizer.ggml.pre is \"no-such-pre\"", 0), 0u) << r.err;
}

TEST(GgufTokenizerErrors, AnotherTokenizerModelIsNamed) {
  ASSERT_EQ(synthetic().error, "");
  const auto path = synthetic().dir + "/bad-model.gguf";
  EXPECT_EQ(error_of([&] { Tokenizer::load(path); }),
            path + ": tokenizer.ggml.model is \"llama\"; only \"gpt2\" (byte-level BPE) is supported");
}

}  // namespace gguf_tokenizer_test
}  // namespace gradaccum::data
