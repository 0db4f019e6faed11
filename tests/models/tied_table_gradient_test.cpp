// models/tied_table_gradient: a tied LM head's table gets the fused loss's dense
// gradient with the lookup's rows added in place, in either order of the two
// backward nodes, and whole models get the plain autograd path's gradients.
#include "gradaccum/models/tied_table_gradient.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "gradaccum/models/bloom.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/gpt2.h"
#include "padded_batches.h"
#include "test_support.h"
#include "tiny_decoders.h"

namespace tied_table_gradient_test {

using gradaccum::core::kIgnoreIndex;
using gradaccum::models::BloomForCausalLm;
using gradaccum::models::causal_lm_loss;
using gradaccum::models::CausalLm;
using gradaccum::models::Gpt2LmHeadModel;
using gradaccum::models::TiedTableGradient;
using gradaccum::testing::max_relative_difference;
using gradaccum::testing::zero_grads;

struct Parts {
  torch::Tensor table, head, ids, rows, expected;
};

// A [5, 3] table, a head gradient, and rows at ids with a repeat (id 1 twice).
Parts parts() {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  Parts p;
  p.table = torch::randn({5, 3}, generator, torch::kDouble);
  p.head = torch::randn({5, 3}, generator, torch::kDouble);
  p.ids = torch::tensor({1, 4, 1, 0}, torch::kLong);
  p.rows = torch::randn({4, 3}, generator, torch::kDouble);
  p.expected = p.head.clone();
  for (int64_t i = 0; i < 4; ++i) p.expected[p.ids[i].item<int64_t>()] += p.rows[i];
  return p;
}

TEST(TiedTableGradient, LossFirstTheLookupReturnsTheSumInTheHeadsBuffer) {
  auto p = parts();
  auto pairing = c10::make_intrusive<TiedTableGradient>();
  auto head = p.head.clone();
  const void* head_buffer = head.data_ptr();
  EXPECT_FALSE(pairing->hand_over(head).defined());  // the lookup will return it
  const auto sum = pairing->add_rows(p.table, p.ids, p.rows);
  EXPECT_EQ(sum.data_ptr(), head_buffer);  // in place: no [V, H] buffer more
  EXPECT_TRUE(torch::equal(sum, p.expected));
}

TEST(TiedTableGradient, LookupFirstEachReturnsItsOwnPart) {
  auto p = parts();
  auto pairing = c10::make_intrusive<TiedTableGradient>();
  const auto rows_only = pairing->add_rows(p.table, p.ids, p.rows);
  const auto head = pairing->hand_over(p.head.clone());
  ASSERT_TRUE(head.defined());
  EXPECT_TRUE(torch::equal(head, p.head));
  EXPECT_EQ(max_relative_difference(rows_only + head, p.expected), 0.0);
  EXPECT_DOUBLE_EQ(rows_only[2].abs().sum().item<double>(), 0.0);  // id 2 was not looked up
}

// The table's gradient (and every other) through CausalLm::loss equals autograd's on
// the model's own logits (embedding + linear + cross-entropy), over two micro-steps
// accumulated into .grad: the first is taken over, the second added in place.
void expect_plain_gradients(CausalLm model) {
  model.module().to(torch::kDouble);
  auto& module = model.module();
  std::vector<gradaccum::core::Batch> batches;
  for (const uint64_t seed : {3, 4}) {
    const auto data = gradaccum::testing::pad(gradaccum::testing::make_sequences({3, 11, 6}, seed), true);
    batches.push_back({data.ids, data.ids.masked_fill(data.mask.eq(0), kIgnoreIndex), data.mask, 3});
  }
  zero_grads(module);
  for (const auto& b : batches) (model.loss(b).sum * 0.37).backward();
  const auto paired = gradaccum::testing::flat_grads(module);
  zero_grads(module);
  auto& lm = dynamic_cast<gradaccum::models::CausalLmHeadImpl&>(module);
  ASSERT_TRUE(lm.tied());
  for (const auto& b : batches) (causal_lm_loss(lm.forward(b.input, b.attention_mask), b.target).sum * 0.37).backward();
  const auto plain = gradaccum::testing::flat_grads(module);
  const double diff = max_relative_difference(paired, plain);
  std::printf("[ measured ] all gradients, paired vs plain: %.3e\n", diff);
  EXPECT_LE(diff, 1e-12);
  EXPECT_GT(plain.abs().sum().item<double>(), 0.0);
}

TEST(TiedTableGradient, Gpt2GradientsEqualThePlainAutogradPath) {
  expect_plain_gradients(CausalLm(Gpt2LmHeadModel(gradaccum::testing::tiny_gpt2_config())));
}

TEST(TiedTableGradient, BloomGradientsEqualThePlainAutogradPath) {
  expect_plain_gradients(CausalLm(BloomForCausalLm(gradaccum::testing::tiny_bloom_config())));
}

}  // namespace tied_table_gradient_test
