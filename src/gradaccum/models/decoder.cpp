#include "gradaccum/models/decoder.h"

#include "gradaccum/base/check.h"
#include "gradaccum/base/host_reads.h"

namespace gradaccum::models {

namespace {
std::string shape(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}
}  // namespace

core::ParameterUnits DecoderImpl::units() {
  core::ParameterUnits units;
  for (const auto& block : blocks()) {
    std::vector<torch::Tensor> trainable;
    for (const auto& p : block->parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    units.push_back(std::move(trainable));
  }
  return units;
}

torch::Tensor DecoderImpl::run_block(int64_t index, const torch::nn::Module& block, const CheckpointFn& fn,
                                     std::vector<torch::Tensor> inputs) {
  return core::run_unit(unit_scope_, index, inputs.at(0), [&](const torch::Tensor& x) {
    inputs[0] = x;
    return checkpoint_blocks() ? checkpoint(fn, inputs, block.parameters()) : fn(inputs);
  });
}

void check_decoder_inputs(const std::string& model, const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                          int64_t vocab_size, int64_t max_positions) {
  GA_CHECK(input_ids.defined(), "{}: input_ids is undefined", model);
  GA_CHECK(input_ids.dim() == 2 && input_ids.size(1) > 0, "{}: input_ids must be [batch, time] with time >= 1, got {}",
           model, shape(input_ids));
  GA_CHECK(input_ids.scalar_type() == torch::kLong || input_ids.scalar_type() == torch::kInt,
           "{}: input_ids must be int64 (or int32) token ids, got {}", model, c10::toString(input_ids.scalar_type()));
  GA_CHECK(max_positions == 0 || input_ids.size(1) <= max_positions, "{}: sequence length {} exceeds n_positions {}",
           model, input_ids.size(1), max_positions);
  if (input_ids.device().is_cpu() && input_ids.numel() > 0) {
    GRADACCUM_CPU_HOST_READ_SCOPE();  // free on the CPU; elsewhere the data layer checked the ids
    const int64_t low = input_ids.min().item<int64_t>(), high = input_ids.max().item<int64_t>();
    GA_CHECK(low >= 0 && high < vocab_size, "{}: input_ids must lie in [0, vocab_size = {}), got values in [{}, {}]",
             model, vocab_size, low, high);
  }
  if (attention_mask.defined()) {
    GA_CHECK(attention_mask.sizes() == input_ids.sizes(), "{}: attention_mask {} does not match input_ids {}", model,
             shape(attention_mask), shape(input_ids));
  }
}

torch::Tensor causal_attention_allowed(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  const int64_t time = input_ids.size(1);
  auto causal = torch::ones({time, time}, torch::TensorOptions().dtype(torch::kBool).device(input_ids.device()))
                    .tril()
                    .view({1, 1, time, time});
  if (!attention_mask.defined()) return causal;
  auto real_key = attention_mask.ne(0).view({input_ids.size(0), 1, 1, time});
  return causal.logical_and(real_key);
}

torch::Tensor position_ids_from_mask(const torch::Tensor& attention_mask) {
  auto mask = attention_mask.to(torch::kLong);
  return (mask.cumsum(-1) - 1).masked_fill(mask.eq(0), 1);
}

}  // namespace gradaccum::models
