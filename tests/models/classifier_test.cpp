// Sequence classification on GPT-2 and BLOOM backbones: last-real-token
// pooling under padding, and exact accumulation — one item per row, so every
// split of a window (4×2, 8×1, 2×4, 16×1) gives the full batch's gradient.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "gradaccum/base/check.h"
#include "gradaccum/core/loss_normalizer.h"
#include "gradaccum/models/bloom.h"
#include "gradaccum/models/gpt2.h"
#include "gradaccum/models/sequence_classifier.h"
#include "padded_batches.h"
#include "test_support.h"

namespace classifier_test {

using gradaccum::core::LossNormalization;
using gradaccum::models::as_decoder;
using gradaccum::models::Decoder;
using gradaccum::models::SequenceClassificationModel;
using gradaccum::models::SequenceClassifier;
using gradaccum::testing::accumulate_padded_window;
using gradaccum::testing::flat_grads;
using gradaccum::testing::make_sequences;
using gradaccum::testing::max_relative_difference;
using gradaccum::testing::pad;
using gradaccum::testing::Padded;

constexpr int64_t kLabels = 3;

Decoder make_backbone(const std::string& architecture) {
  if (architecture == "gpt2") {
    gradaccum::models::Gpt2Config c;
    c.vocab_size = 64;
    c.n_positions = 32;
    c.n_embd = 16;
    c.n_layer = 2;
    c.n_head = 2;
    c.init_seed = 1234;
    return as_decoder(gradaccum::models::Gpt2Model(c));
  }
  gradaccum::models::BloomConfig c;
  c.vocab_size = 64;
  c.hidden_size = 24;
  c.n_layer = 2;
  c.n_head = 6;
  c.init_seed = 1234;
  return as_decoder(gradaccum::models::BloomModel(c));
}

SequenceClassifier make_classifier(const std::string& architecture, torch::ScalarType dtype) {
  // initializer_range 0.2 for the score, not 0.02: logits of order 1, so the
  // cross-entropy's gradient is not nearly the same for every row.
  SequenceClassifier classifier{SequenceClassificationModel(make_backbone(architecture), kLabels, 0.2, 99)};
  classifier.module().to(dtype);
  return classifier;
}

const std::vector<std::string> kArchitectures = {"gpt2", "bloom"};

// Rows of lengths 1 .. 12 (one single-token row), labels in [0, kLabels).
struct Rows {
  std::vector<torch::Tensor> sequences;
  torch::Tensor labels;  // [B] int64
};
Rows make_rows(const std::vector<int64_t>& lengths, uint64_t seed = 5) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed + 1000);
  const auto rows = static_cast<int64_t>(lengths.size());
  return {make_sequences(lengths, seed), torch::randint(0, kLabels, {rows}, generator, torch::kLong)};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const gradaccum::Error& e) {
    return e.what();
  }
  return "(no gradaccum::Error)";
}

TEST(ClassifierModel, ParameterNamesFollowHuggingFace) {
  for (const auto& architecture : kArchitectures) {
    auto classifier = make_classifier(architecture, torch::kFloat);
    auto params = classifier.module().named_parameters();
    const int64_t hidden = architecture == "gpt2" ? 16 : 24;
    ASSERT_NE(params.find("score.weight"), nullptr) << architecture;
    EXPECT_EQ(params["score.weight"].sizes().vec(), (std::vector<int64_t>{kLabels, hidden}));
    EXPECT_EQ(params.find("score.bias"), nullptr);
    EXPECT_NE(params.find(architecture == "gpt2" ? "transformer.wte.weight" : "transformer.word_embeddings.weight"),
              nullptr);
    // The backbone's own parameters and the score, nothing else.
    EXPECT_EQ(params.size(), (architecture == "gpt2" ? 28u : 29u) + 1u) << architecture;
  }
}

// The row's logits are the score of its last real token's hidden state, so
// they do not depend on which side the padding is or how much there is.
TEST(ClassifierModel, PoolsTheLastRealToken) {
  const auto rows = make_rows({7, 12, 3, 1});
  for (const auto& architecture : kArchitectures) {
    auto classifier = make_classifier(architecture, torch::kDouble);
    auto& model = classifier.model();
    torch::NoGradGuard no_grad;
    double worst = 0.0;
    const auto right = pad(rows.sequences, false);
    auto reference = model->forward(right.ids, right.mask);
    ASSERT_EQ(reference.sizes().vec(), (std::vector<int64_t>{4, kLabels}));
    // By hand: score(hidden state at position n - 1) of each row alone.
    for (size_t i = 0; i < rows.sequences.size(); ++i) {
      const auto& s = rows.sequences[i];
      auto hidden = model->transformer->hidden_states(s.unsqueeze(0), {});
      auto expected = model->score->forward(hidden[0][s.size(0) - 1]);
      worst = std::max(worst, max_relative_difference(reference[i], expected));
      // No mask: the last position, which is the last real token of an unpadded row.
      worst = std::max(worst, max_relative_difference(model->forward(s.unsqueeze(0))[0], expected));
    }
    for (bool left : {true, false}) {
      for (int64_t width : {12, 15, 20}) {
        const auto padded = pad(rows.sequences, left, width);
        worst = std::max(worst, max_relative_difference(model->forward(padded.ids, padded.mask), reference));
      }
    }
    std::printf("[ measured ] %s: logits over paddings vs alone: %.3e\n", architecture.c_str(), worst);
    EXPECT_LE(worst, 1e-12) << architecture;
    // Pooling the last position of a right-padded batch instead would read padding.
    EXPECT_GT(max_relative_difference(model->forward(right.ids), reference), 1e-3);
  }
  EXPECT_TRUE(
      torch::equal(gradaccum::models::last_real_token(torch::tensor({{1, 1, 0, 0}, {0, 0, 1, 1}, {0, 1, 0, 0}})),
                   torch::tensor({1, 3, 1}, torch::kLong)));
}

// 8 padded rows: 4×2, 8×1 and 2×4 give the full batch's gradient and loss.
TEST(ClassifierAccumulation, SplitsEqualFullBatch) {
  const auto rows = make_rows({3, 4, 11, 12, 5, 6, 9, 10});
  for (const auto& architecture : kArchitectures) {
    for (bool left : {false, true}) {
      const auto data = pad(rows.sequences, left);
      for (auto dtype : {torch::kDouble, torch::kFloat}) {
        auto full = make_classifier(architecture, dtype);
        const double full_loss = accumulate_padded_window(full, data, rows.labels, {8}, LossNormalization::window, 1);
        const double tolerance = dtype == torch::kDouble ? 1e-10 : 1e-5;
        for (const auto& splits : std::vector<std::vector<int64_t>>{{2, 2, 2, 2}, {1, 1, 1, 1, 1, 1, 1, 1}, {4, 4}}) {
          auto split = make_classifier(architecture, dtype);
          const double loss = accumulate_padded_window(split, data, rows.labels, splits, LossNormalization::window,
                                                       static_cast<int64_t>(splits.size()));
          const double difference = max_relative_difference(flat_grads(split.module()), flat_grads(full.module()));
          std::printf(
              "[ measured ] %s %s %s, %zu micro-batches: grad rel diff %.3e, loss %.12f "
              "vs %.12f\n",
              architecture.c_str(), dtype == torch::kDouble ? "float64" : "float32", left ? "left" : "right",
              splits.size(), difference, loss, full_loss);
          EXPECT_LE(difference, tolerance) << architecture;
          EXPECT_NEAR(loss, full_loss, tolerance * full_loss) << architecture;
        }
        EXPECT_GT(flat_grads(full.module()).abs().max().item<double>(), 1e-3);
      }
    }
  }
}

// Seed 001's shape: batch 1 × 16 accumulation steps equals batch 16.
TEST(ClassifierAccumulation, BatchOneBySixteenEqualsBatchSixteen) {
  const auto rows = make_rows({2, 9, 4, 12, 7, 1, 5, 11, 3, 8, 6, 10, 12, 2, 9, 4}, /*seed=*/17);
  const auto data = pad(rows.sequences, false);
  for (const auto& architecture : kArchitectures) {
    auto full = make_classifier(architecture, torch::kDouble);
    const double full_loss = accumulate_padded_window(full, data, rows.labels, {16}, LossNormalization::window, 1);
    auto split = make_classifier(architecture, torch::kDouble);
    const double loss =
        accumulate_padded_window(split, data, rows.labels, std::vector<int64_t>(16, 1), LossNormalization::window, 16);
    const double difference = max_relative_difference(flat_grads(split.module()), flat_grads(full.module()));
    std::printf("[ measured ] %s 16x1 vs 16: grad rel diff %.3e\n", architecture.c_str(), difference);
    EXPECT_LE(difference, 1e-10) << architecture;
    EXPECT_NEAR(loss, full_loss, 1e-10 * full_loss) << architecture;
  }
}

// After a window's first micro-step the token lookup hands back its rows sparsely and autograd
// adds them into the table's gradient in place: that gradient keeps its storage, stays dense and
// equals the dense lookup's (each micro-step's gradient computed apart and added). Without the
// sparse rows every micro-step's lookup gradient would arrive dense.
TEST(ClassifierAccumulation, LaterMicroStepsAddTheLookedUpRowsIntoTheTablesGradient) {
  const auto rows = make_rows({3, 4, 11, 12, 5, 6}, /*seed=*/23);
  const auto data = pad(rows.sequences, false);
  for (const auto& architecture : kArchitectures) {
    const std::string name = architecture == "gpt2" ? "transformer.wte.weight" : "transformer.word_embeddings.weight";
    auto in_place = make_classifier(architecture, torch::kDouble);
    auto apart = make_classifier(architecture, torch::kDouble);
    auto table = in_place.module().named_parameters()[name];
    auto reference = apart.module().named_parameters()[name];
    std::vector<bool> arrived_sparse;
    table.register_hook([&arrived_sparse](const torch::Tensor& g) { arrived_sparse.push_back(g.is_sparse()); });
    const void* storage = nullptr;
    for (int64_t k = 0; k < 3; ++k) {
      gradaccum::core::Batch batch{data.ids.slice(0, 2 * k, 2 * k + 2), rows.labels.slice(0, 2 * k, 2 * k + 2),
                                   data.mask.slice(0, 2 * k, 2 * k + 2), 2};
      in_place.loss(batch).sum.backward();
      ASSERT_TRUE(table.grad().defined());
      EXPECT_FALSE(table.grad().is_sparse()) << architecture;
      if (k == 0) storage = table.grad().data_ptr();
      EXPECT_EQ(table.grad().data_ptr(), storage) << architecture << " micro-step " << k;

      const auto held = reference.grad().defined() ? reference.grad().clone() : torch::Tensor();
      reference.mutable_grad() = torch::Tensor();  // a dense lookup gradient, as at a window's start
      apart.loss(batch).sum.backward();
      if (held.defined()) reference.mutable_grad() = reference.grad() + held;
    }
    EXPECT_EQ(arrived_sparse, (std::vector<bool>{false, true, true})) << architecture;
    EXPECT_LE(max_relative_difference(table.grad(), reference.grad()), 1e-15) << architecture;
    EXPECT_GT(reference.grad().abs().max().item<double>(), 1e-3) << architecture;
  }
}

TEST(ClassifierTask, EvaluateSumsLossRowsAndCorrect) {
  const auto rows = make_rows({3, 8, 5, 6, 2, 7});
  const auto data = pad(rows.sequences, true);
  for (const auto& architecture : kArchitectures) {
    auto classifier = make_classifier(architecture, torch::kDouble);
    torch::NoGradGuard no_grad;
    gradaccum::core::Batch batch{data.ids, rows.labels, data.mask, 6};
    auto sums = classifier.evaluate(batch);
    auto logits = classifier.model()->forward(data.ids, data.mask);
    auto log_p = torch::log_softmax(logits, 1);
    const double expected = -log_p.gather(1, rows.labels.unsqueeze(1)).sum().item<double>();
    EXPECT_NEAR(sums.loss_sum.item<double>(), expected, 1e-12 * expected);
    EXPECT_EQ(sums.count.item<int64_t>(), 6);
    EXPECT_EQ(sums.correct.item<int64_t>(), logits.argmax(1).eq(rows.labels).sum().item<int64_t>());
    auto l = classifier.loss(batch);
    EXPECT_EQ(l.sum.item<double>(), sums.loss_sum.item<double>());
    EXPECT_EQ(l.count.item<int64_t>(), 6);
  }
}

TEST(ClassifierTask, BadLabelsAreAnErrorNamingThem) {
  auto classifier = make_classifier("bloom", torch::kFloat);
  const auto data = pad(make_sequences({3, 4}, 1), false);
  auto run = [&](torch::Tensor labels) { return error_of([&] { classifier.loss({data.ids, labels, data.mask, 2}); }); };
  EXPECT_EQ(run(torch::tensor({{0}, {1}}, torch::kLong)),
            "sequence classifier: labels must be [2] (one per row), got 2 dims of shape [2, 1]");
  EXPECT_EQ(run(torch::tensor({0, 3}, torch::kLong)),
            "sequence classifier: labels must lie in [0, num_labels = 3), got values in [0, 3]");
  EXPECT_EQ(run(torch::tensor({0.0, 1.0}, torch::kDouble)), "sequence classifier: labels must be int64, got Double");
  EXPECT_EQ(error_of([&] { SequenceClassificationModel(make_backbone("gpt2"), 0); }),
            "sequence classifier: num_labels must be positive, got 0");
}

}  // namespace classifier_test
