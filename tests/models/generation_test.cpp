// models::generate_text: the one path `train`'s sample and `gradaccum generate` take from a prompt
// to its continuation; the continuation arrives piece by piece as it is drawn.
#include "gradaccum/models/generation.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

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

}  // namespace generation_test
