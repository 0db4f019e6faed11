// The decoder backbone as the heads see it: token ids and an attention mask in,
// hidden states out. GPT-2 (gpt2.h) and BLOOM (bloom.h) implement it, so the
// causal-LM head (causal_lm.h) and the sequence classifier
// (sequence_classifier.h) work on either without knowing which.
//
// A head registers its backbone as `transformer`, which keeps HF's parameter
// names (transformer.wte.weight, transformer.word_embeddings.weight, ...).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "gradaccum/core/parameter_units.h"
#include "gradaccum/models/activation_checkpoint.h"
#include "gradaccum/models/tied_table_gradient.h"

namespace gradaccum::models {

// How the token lookup hands back the gradient of the embedding table.
//  dense():  a [vocab, hidden] tensor, zero outside the looked-up rows (libtorch's
//            default for nn::Embedding).
//  sparse(): the looked-up rows only. Valid only when the table already holds a
//            dense .grad that autograd adds the rows into in place (a sequence
//            classifier after a window's first micro-step): it saves the dense
//            lookup gradient's [vocab, hidden] zero fill per micro-step (1 GB at
//            BLOOM-560m's 250880 × 1024).
//  into(pairing): the rows added in place into a tied LM head's dense gradient of
//            the same table, computed by the same backward (tied_table_gradient.h).
class TokenEmbeddingGrad {
 public:
  static TokenEmbeddingGrad dense() { return TokenEmbeddingGrad(Kind::dense, {}); }
  static TokenEmbeddingGrad sparse() { return TokenEmbeddingGrad(Kind::sparse, {}); }
  static TokenEmbeddingGrad into(c10::intrusive_ptr<TiedTableGradient> pairing) {
    return TokenEmbeddingGrad(Kind::into_pairing, std::move(pairing));
  }

  // The rows of `table` for `input_ids`, as nn::Embedding's forward with default options.
  torch::Tensor lookup(const torch::Tensor& table, const torch::Tensor& input_ids) const {
    if (kind_ == Kind::into_pairing) return lookup_tied_rows(table, input_ids, pairing_);
    return torch::embedding(table, input_ids, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false,
                            /*sparse=*/kind_ == Kind::sparse);
  }

 private:
  enum class Kind { dense, sparse, into_pairing };
  TokenEmbeddingGrad(Kind kind, c10::intrusive_ptr<TiedTableGradient> pairing)
      : kind_(kind), pairing_(std::move(pairing)) {}
  Kind kind_;
  c10::intrusive_ptr<TiedTableGradient> pairing_;
};

// Whether `table` already holds a dense .grad that a sparse lookup gradient is
// added into in place (the window's earlier micro-steps left it there).
inline bool holds_dense_grad(const torch::Tensor& table) { return table.grad().defined() && !table.grad().is_sparse(); }

class DecoderImpl : public torch::nn::Module {
 public:
  // input_ids [B, T] int64; attention_mask [B, T] (1 = real token, 0 = padding)
  // or undefined for no padding. Returns the final hidden states [B, T,
  // hidden_size()], after the final LayerNorm. Every real token's state is the
  // same whether its row is padded on the left, on the right or not at all.
  virtual torch::Tensor hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                      const TokenEmbeddingGrad& embedding_grad = TokenEmbeddingGrad::dense()) = 0;
  // The token embedding [vocab_size, hidden_size], which a tied LM head reuses
  // as its output projection (the parameter itself, not a copy).
  virtual torch::Tensor token_embedding() = 0;
  virtual int64_t hidden_size() const = 0;
  virtual int64_t vocab_size() const = 0;
  // The longest sequence the model accepts; 0 = unbounded (BLOOM's ALiBi has no
  // position table).
  virtual int64_t max_positions() const = 0;

  // Activation checkpointing (activation_checkpoint.h) of every block: in
  // training mode with grad enabled, blocks keep no activations in the forward
  // and recompute them in the backward; the gradients are those of the plain
  // run. Eval mode, no-grad and generation run the blocks plainly. Off by
  // default.
  void set_gradient_checkpointing(bool enabled) { gradient_checkpointing_ = enabled; }
  bool gradient_checkpointing() const { return gradient_checkpointing_; }

  // One unit per block (parameter_units.h): each block's trainable parameters, in order (empty
  // for a block with none). The embeddings and the final norm are the root.
  core::ParameterUnits units();
  // The scope every block runs in from now on (nullptr: none).
  void set_unit_scope(core::UnitScope* scope) { unit_scope_ = scope; }

 protected:
  // The blocks, in the order the forward runs them.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> blocks() const = 0;
  // Block `index` as fn(inputs), inputs[0] being the hidden state: inside the unit scope, and
  // through checkpoint() when checkpointing is on in training (the scope outside it, so that a
  // checkpointed block's recompute finds its parameters present once for the whole backward).
  torch::Tensor run_block(int64_t index, const torch::nn::Module& block, const CheckpointFn& fn,
                          std::vector<torch::Tensor> inputs);

 private:
  bool checkpoint_blocks() const { return gradient_checkpointing_ && is_training(); }

  bool gradient_checkpointing_ = false;
  core::UnitScope* unit_scope_ = nullptr;
};
TORCH_MODULE(Decoder);

// A concrete backbone's holder (Gpt2Model, BloomModel) as a Decoder sharing the
// same module.
template <typename Impl>
Decoder as_decoder(const torch::nn::ModuleHolder<Impl>& backbone) {
  static_assert(std::is_base_of_v<DecoderImpl, Impl>, "as_decoder: not a DecoderImpl");
  return Decoder(std::static_pointer_cast<DecoderImpl>(backbone.ptr()));
}

// Checks a decoder's inputs and throws gradaccum::Error naming `model` and what
// is wrong: input_ids [B, T] int64 or int32 with T ≥ 1 (and ≤ max_positions unless
// 0), ids in [0, vocab_size) (checked on CPU tensors only, where it costs no
// device synchronization), attention_mask undefined or of input_ids' shape.
void check_decoder_inputs(const std::string& model, const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                          int64_t vocab_size, int64_t max_positions);

// Which keys each query may attend to: causal (key s ≤ query t) and, with a
// mask, the key is a real token. [B or 1, 1, T, T] bool.
torch::Tensor causal_attention_allowed(const torch::Tensor& input_ids, const torch::Tensor& attention_mask);

// HF's position ids for a padded batch (what its generate() passes): the number of real tokens
// before each position, cumsum(mask) - 1, and 1 at padding (no real token attends to padding, so
// any valid index would do). attention_mask [B, T] (1 = real); returns [B, T] int64.
torch::Tensor position_ids_from_mask(const torch::Tensor& attention_mask);

}  // namespace gradaccum::models
