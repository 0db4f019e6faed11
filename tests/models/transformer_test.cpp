// The configurable decoder (models/transformer.h) on its own: with GPT-2's options (learned
// positions, LayerNorm with bias, tanh GELU, biases everywhere) and GPT-2's weights it is GPT-2;
// a real token's hidden state does not depend on padding (left, right, none) under RoPE with
// grouped-query attention and a sliding window, or under ALiBi; the attention's path for dropout
// (the probabilities as a tensor, query heads folded per key-value head) equals the fused one;
// checkpointed blocks give the plain gradients; bad options are refused naming them. Transformers
// as the reference for the Llama family is tests/models/hf_interop_test.cpp.
#include "gradaccum/models/transformer.h"

#include <gtest/gtest.h>

#include "gradaccum/models/gpt2.h"
#include "test_support.h"
#include "tiny_decoders.h"

namespace transformer_test {

using namespace gradaccum;
using gradaccum::testing::max_relative_difference;

models::TransformerOptions tiny_llama() {
  models::TransformerOptions o;
  o.vocab_size = 40;
  o.hidden_size = 24;
  o.num_layers = 3;
  o.num_heads = 6;
  o.num_kv_heads = 2;
  o.intermediate_size = 32;
  o.max_position_embeddings = 32;
  o.rope.theta = 100.0;
  o.sliding_windows = {0, 3, 0};
  o.init_seed = 5;
  return o;
}

// Every parameter redrawn, so that norms and biases are not their initial 1 and 0.
void redraw(torch::nn::Module& module, uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& p : module.parameters()) p.copy_(0.5 * torch::randn_like(p) + (p.dim() == 1 ? 1.0 : 0.0));
}

TEST(TransformerDecoder, WithGpt2sOptionsAndWeightsItIsGpt2) {
  auto c = gradaccum::testing::tiny_gpt2_config(2);
  models::Gpt2Model gpt2(c);
  redraw(*gpt2, 3);
  models::TransformerOptions o;
  o.vocab_size = c.vocab_size;
  o.hidden_size = c.n_embd;
  o.num_layers = c.n_layer;
  o.num_heads = c.n_head;
  o.intermediate_size = 4 * c.n_embd;
  o.max_position_embeddings = c.n_positions;
  o.positions = models::PositionKind::learned;
  o.norm = models::DecoderNorm::layer_norm;
  o.norm_eps = c.layer_norm_epsilon;
  o.norm_bias = o.mlp_bias = o.qkv_bias = o.o_bias = true;
  o.mlp = models::MlpKind::gelu_tanh;
  models::TransformerDecoder decoder(o);
  {
    torch::NoGradGuard no_grad;
    auto copy = [](torch::Tensor to, const torch::Tensor& from) { to.copy_(from); };
    copy(decoder->embed_tokens->weight, gpt2->wte->weight);
    copy(decoder->embed_positions->weight, gpt2->wpe->weight);
    const int64_t C = c.n_embd;
    for (int64_t i = 0; i < c.n_layer; ++i) {
      auto g = gpt2->h->ptr<models::Gpt2BlockImpl>(static_cast<size_t>(i));
      auto t = decoder->layers->ptr<models::TransformerBlockImpl>(static_cast<size_t>(i));
      copy(t->input_layernorm->weight, g->ln_1->weight);
      copy(t->input_layernorm->bias, g->ln_1->bias);
      copy(t->post_attention_layernorm->weight, g->ln_2->weight);
      copy(t->post_attention_layernorm->bias, g->ln_2->bias);
      const auto& qkv = g->attn->c_attn;
      int64_t part = 0;
      for (auto* proj : {&t->self_attn->q_proj, &t->self_attn->k_proj, &t->self_attn->v_proj}) {
        copy((*proj)->weight, qkv->weight.narrow(0, part * C, C));
        copy((*proj)->bias, qkv->bias.narrow(0, part * C, C));
        ++part;
      }
      copy(t->self_attn->o_proj->weight, g->attn->c_proj->weight);
      copy(t->self_attn->o_proj->bias, g->attn->c_proj->bias);
      copy(t->mlp->up_proj->weight, g->mlp->c_fc->weight);
      copy(t->mlp->up_proj->bias, g->mlp->c_fc->bias);
      copy(t->mlp->down_proj->weight, g->mlp->c_proj->weight);
      copy(t->mlp->down_proj->bias, g->mlp->c_proj->bias);
    }
    copy(decoder->norm->weight, gpt2->ln_f->weight);
    copy(decoder->norm->bias, gpt2->ln_f->bias);
  }
  gpt2->to(torch::kDouble);
  decoder->to(torch::kDouble);
  const auto ids = torch::randint(0, c.vocab_size, {3, 11}, torch::kLong);
  auto mask = torch::ones({3, 11}, torch::kLong);
  mask[1].slice(0, 8).zero_();
  mask[2].slice(0, 0, 4).zero_();
  torch::NoGradGuard no_grad;
  const auto expected = gpt2->forward(ids, mask), got = decoder->forward(ids, mask);
  const auto real = mask.to(torch::kBool);
  EXPECT_LE(max_relative_difference(got.index({real}), expected.index({real})), 1e-12);
  EXPECT_GT(expected.abs().max().item<double>(), 0.5);
}

// Row 0 unpadded; row 1 the same tokens left-padded by 3; row 2 right-padded by 3. Their real
// tokens' states must agree.
void expect_padding_invariant(models::TransformerOptions o, const std::string& what) {
  models::TransformerDecoder decoder(o);
  redraw(*decoder, 11);
  decoder->to(torch::kDouble);
  const int64_t T = 10, pad = 3;
  const auto row = torch::randint(1, o.vocab_size, {T}, torch::kLong);
  auto ids = torch::zeros({3, T + pad}, torch::kLong);
  auto mask = torch::zeros({3, T + pad}, torch::kLong);
  ids[0].slice(0, 0, T).copy_(row);
  mask[0].slice(0, 0, T).fill_(1);
  ids[1].slice(0, pad).copy_(row);
  mask[1].slice(0, pad).fill_(1);
  ids[2].slice(0, 0, T).copy_(row);
  mask[2].slice(0, 0, T).fill_(1);
  torch::NoGradGuard no_grad;
  const auto alone = decoder->forward(row.unsqueeze(0));  // no mask at all
  const auto padded = decoder->forward(ids, mask);
  EXPECT_LE(max_relative_difference(padded[0].slice(0, 0, T), alone[0]), 1e-12) << what;
  EXPECT_LE(max_relative_difference(padded[1].slice(0, pad), alone[0]), 1e-12) << what;
  EXPECT_LE(max_relative_difference(padded[2].slice(0, 0, T), alone[0]), 1e-12) << what;
}

TEST(TransformerDecoder, PaddingLeftRightOrNoneGivesRealTokensTheSameStates) {
  expect_padding_invariant(tiny_llama(), "rope, gqa, sliding window");
  auto mqa = tiny_llama();
  mqa.num_kv_heads = 1;
  mqa.qk_norm = mqa.qkv_bias = true;
  mqa.head_dim = 6;
  mqa.rope.type = models::RopeType::llama3;
  mqa.rope.factor = 4.0;
  mqa.rope.original_max_position_embeddings = 8;
  expect_padding_invariant(mqa, "rope llama3, mqa, qk-norm");
  auto alibi = tiny_llama();
  alibi.positions = models::PositionKind::alibi;
  alibi.norm = models::DecoderNorm::layer_norm;
  alibi.norm_bias = true;
  expect_padding_invariant(alibi, "alibi, layer norm");
}

TEST(TransformerDecoder, TheSlidingWindowHidesKeysBeyondIt) {
  auto windowed = tiny_llama();
  auto full = windowed;
  full.sliding_windows.clear();
  models::TransformerDecoder a(windowed), b(full);
  redraw(*a, 2);
  redraw(*b, 2);
  torch::NoGradGuard no_grad;
  const auto ids = torch::randint(0, 40, {1, 8}, torch::kLong);
  const auto x = a->forward(ids), y = b->forward(ids);
  // Within the window (the first 3 positions) nothing differs; beyond it the states do.
  EXPECT_TRUE(torch::allclose(x.slice(1, 0, 3), y.slice(1, 0, 3), 1e-6, 1e-6));
  EXPECT_GT(max_relative_difference(x.slice(1, 3), y.slice(1, 3)), 1e-3);
}

TEST(TransformerDecoder, TheDropoutPathEqualsTheFusedAttention) {
  // A dropout probability so small that nothing is dropped: the probabilities go through the
  // explicit path (folded query heads, two matmuls) and are scaled by 1 / (1 - 1e-12).
  auto o = tiny_llama();
  o.attention_dropout = 1e-12;
  o.dropout_rng = models::DropoutRng::libtorch;
  models::TransformerDecoder decoder(o);
  redraw(*decoder, 4);
  decoder->to(torch::kDouble);
  const auto ids = torch::randint(0, 40, {2, 9}, torch::kLong);
  auto mask = torch::ones({2, 9}, torch::kLong);
  mask[1].slice(0, 0, 2).zero_();
  decoder->eval();
  const auto fused = decoder->forward(ids, mask).detach();
  decoder->train();
  const auto explicit_path = decoder->forward(ids, mask).detach();
  const auto real = mask.to(torch::kBool);
  EXPECT_LE(max_relative_difference(explicit_path.index({real}), fused.index({real})), 1e-10);
}

TEST(TransformerDecoder, CheckpointedBlocksGiveThePlainGradients) {
  auto o = tiny_llama();
  models::TransformerDecoder decoder(o);
  decoder->to(torch::kDouble);
  const auto ids = torch::randint(0, 40, {2, 9}, torch::kLong);
  auto mask = torch::ones({2, 9}, torch::kLong);
  mask[0].slice(0, 6).zero_();
  std::vector<torch::Tensor> grads[2];
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    decoder->set_gradient_checkpointing(checkpointed == 1);
    decoder->zero_grad();
    decoder->forward(ids, mask).pow(2).sum().backward();
    for (const auto& p : decoder->parameters()) grads[checkpointed].push_back(p.grad().clone());
  }
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_LE(max_relative_difference(grads[1][i], grads[0][i]), 1e-12) << i;
  }
}

TEST(TransformerDecoder, BadOptionsAreRefusedNamingThem) {
  auto o = tiny_llama();
  o.num_kv_heads = 4;
  EXPECT_ONE_LINE_ERROR(models::TransformerDecoder(o, "cfg"),
                        "cfg: num_attention_heads 6 is not a multiple of num_key_value_heads 4");
  o = tiny_llama();
  o.sliding_windows = {3};
  EXPECT_ONE_LINE_ERROR(models::TransformerDecoder(o, "cfg"), "cfg: 1 sliding windows for 3 layers");
  o = tiny_llama();
  o.head_dim = 5;
  EXPECT_ONE_LINE_ERROR(models::TransformerDecoder(o, "cfg"), "cfg: head_dim 5 must be even for rotary positions");
  models::TransformerDecoder decoder(tiny_llama());
  EXPECT_ONE_LINE_ERROR(decoder->forward(torch::zeros({1, 33}, torch::kLong)),
                        "decoder: sequence length 33 exceeds n_positions 32");
}

}  // namespace transformer_test
