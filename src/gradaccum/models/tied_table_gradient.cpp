#include "gradaccum/models/tied_table_gradient.h"

#include <utility>

namespace gradaccum::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct TiedLookup : torch::autograd::Function<TiedLookup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& table, const torch::Tensor& input_ids,
                               const c10::intrusive_ptr<TiedTableGradient>& pairing) {
    ctx->save_for_backward({input_ids});
    ctx->saved_data["table"] = table;  // a reference for the shape, dtype and device of a zero gradient
    ctx->saved_data["pairing"] = c10::IValue::make_capsule(pairing);
    return torch::embedding(table, input_ids);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto ids = ctx->get_saved_variables()[0].reshape({-1});
    const auto table = ctx->saved_data["table"].toTensor();
    auto pairing = c10::static_intrusive_pointer_cast<TiedTableGradient>(ctx->saved_data["pairing"].toCapsule());
    const auto rows = grad_outputs[0].reshape({ids.size(0), table.size(1)});
    return {pairing->add_rows(table, ids, rows), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor TiedTableGradient::hand_over(torch::Tensor head_gradient) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rows_added_) return head_gradient;
  head_gradient_ = std::move(head_gradient);
  return torch::Tensor();
}

torch::Tensor TiedTableGradient::add_rows(const torch::Tensor& table, const torch::Tensor& ids,
                                          const torch::Tensor& rows) {
  std::lock_guard<std::mutex> lock(mutex_);
  rows_added_ = true;
  auto gradient = std::exchange(head_gradient_, torch::Tensor());
  if (!gradient.defined()) gradient = torch::zeros_like(table, torch::MemoryFormat::Contiguous);
  gradient.index_add_(0, ids, rows.to(gradient.scalar_type()));
  return gradient;
}

torch::Tensor lookup_tied_rows(const torch::Tensor& table, const torch::Tensor& input_ids,
                               const c10::intrusive_ptr<TiedTableGradient>& pairing) {
  if (!torch::GradMode::is_enabled() || !table.requires_grad()) return torch::embedding(table, input_ids);
  return TiedLookup::apply(table, input_ids, pairing);
}

}  // namespace gradaccum::models
