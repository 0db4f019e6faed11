// models::generate_text: the one path `train`'s sample and `gradaccum generate` take from a prompt
// to its continuation; the continuation arrives piece by piece as it is drawn.
#include "gradaccum/models/generation.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gradaccum/data/tokenizer.h"
#include "gradaccum/models/gpt2.h"
#include "test_support.h"
#include "tiny_decoders.h"

namespace generation_test {

using gradaccum::data::Tokenizer;
using gradaccum::models::CausalLmHeadImpl;
using gradaccum::models::GenerationOptions;
using gradaccum::models::Gpt2LmHeadModel;

// A tiny GPT-2 over the first 64 of GPT-2's ids: each is one printable ASCII byte ("!" to "`"),
// so every drawn token decodes to one character.
TEST(GenerateText, StreamsEachDrawnTokenAndReturnsTheWholeContinuation) {
  Gpt2LmHeadModel model(gradaccum::testing::tiny_gpt2_config());
  const auto tokenizer = Tokenizer::load(gradaccum::testing::gpt2_tokenizer_dir());
  ASSERT_EQ(tokenizer.encode("A"), (std::vector<gradaccum::data::TokenId>{32}));
  GenerationOptions options;
  options.max_new_tokens = 12;
  options.seed = 5;
  std::vector<std::string> pieces;
  const auto text = gradaccum::models::generate_text(*model, tokenizer, "A", options,
                                                     [&](const std::string& piece) { pieces.push_back(piece); });
  ASSERT_EQ(pieces.size(), 12u);
  std::string joined;
  for (const auto& piece : pieces) {
    EXPECT_EQ(piece.size(), 1u) << piece;
    joined += piece;
  }
  EXPECT_EQ(joined, text);
  // The same draw as the ids' own path, with the same seed; streaming changes nothing.
  const auto ids = gradaccum::models::generate(*model, {32}, options);
  EXPECT_EQ(tokenizer.decode(std::vector<gradaccum::data::TokenId>(ids.begin(), ids.end())), text);
  EXPECT_EQ(gradaccum::models::generate_text(*model, tokenizer, "A", options), text);
  EXPECT_THROW(gradaccum::models::generate_text(*model, tokenizer, "", options), gradaccum::Error);
}

// Generation ends at the first of the model's end-of-sequence ids (SmolLM2-Instruct's <|im_end|>
// is not <|endoftext|>), which the text leaves out.
TEST(GenerateText, StopsAtTheFirstStopTokenAndLeavesItOut) {
  Gpt2LmHeadModel model(gradaccum::testing::tiny_gpt2_config());
  const auto tokenizer = Tokenizer::load(gradaccum::testing::gpt2_tokenizer_dir());
  GenerationOptions options;
  options.max_new_tokens = 12;
  options.seed = 5;
  const auto ids = gradaccum::models::generate(*model, {32}, options);
  ASSERT_EQ(ids.size(), 12u);
  const int64_t stop = ids[3];
  const auto first = std::find(ids.begin(), ids.end(), stop);
  options.stop_tokens = {stop};
  EXPECT_EQ(gradaccum::models::generate(*model, {32}, options), std::vector<int64_t>(ids.begin(), first + 1));
  std::vector<std::string> pieces;
  const auto text = gradaccum::models::generate_text(*model, tokenizer, "A", options,
                                                     [&](const std::string& piece) { pieces.push_back(piece); });
  EXPECT_EQ(text, tokenizer.decode(std::vector<gradaccum::data::TokenId>(ids.begin(), first)));
  EXPECT_EQ(pieces.size(), static_cast<size_t>(first - ids.begin()));
}

TEST(EosTokenIds, ReadsANumberOrAListAndRefusesAnythingElse) {
  using gradaccum::models::eos_token_ids;
  EXPECT_EQ(eos_token_ids(nlohmann::json{{"eos_token_id", 2}}), (std::vector<int64_t>{2}));
  EXPECT_EQ(eos_token_ids(nlohmann::json{{"eos_token_id", {128001, 128008, 128009}}}),
            (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_TRUE(eos_token_ids(nlohmann::json{{"eos_token_id", nullptr}}).empty());
  EXPECT_TRUE(eos_token_ids(nlohmann::json::object()).empty());
  EXPECT_TRUE(eos_token_ids(nlohmann::json()).empty());
  EXPECT_ONE_LINE_ERROR(eos_token_ids(nlohmann::json{{"eos_token_id", "2"}}),
                        "config.json: eos_token_id is \"2\", not a token id or a list of them");
  EXPECT_ONE_LINE_ERROR(eos_token_ids(nlohmann::json{{"eos_token_id", {1, "x"}}}),
                        "config.json: eos_token_id holds \"x\", not a token id");
  EXPECT_ONE_LINE_ERROR(eos_token_ids(nlohmann::json{{"eos_token_id", -1}}),
                        "config.json: eos_token_id -1 is negative");
}

}  // namespace generation_test
