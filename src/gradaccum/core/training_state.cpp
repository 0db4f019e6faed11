#include "gradaccum/core/training_state.h"

#include "gradaccum/base/check.h"

namespace gradaccum::core {

PieceState TrainingState::saved_piece(const std::string& name) const {
  const auto it = pieces.find(name);
  PieceState saved = it != pieces.end() ? it->second : PieceState{};
  saved.piece = name;
  saved.scalars_file = scalars_file;
  saved.tensors_file = tensors_file;
  return saved;
}

std::string PieceState::field_where(const std::string& name) const {
  return fmt::format("{}: field '{}.{}'", scalars_file, piece, name);
}

std::string PieceState::tensor_where(const std::string& name) const {
  return fmt::format("{}: tensor '{}.{}'", tensors_file, piece, name);
}

const PieceState::Scalar& PieceState::scalar(const std::string& name) const {
  const auto it = scalars.find(name);
  GA_CHECK(it != scalars.end(), "{}: missing field '{}.{}'", scalars_file, piece, name);
  return it->second;
}

void PieceState::wrong_kind(const std::string& name, const char* expected) const {
  throw Error(fmt::format("{} has the wrong type ({} expected)", field_where(name), expected));
}

int64_t PieceState::integer(const std::string& name) const {
  const auto* v = std::get_if<int64_t>(&scalar(name));
  if (v == nullptr) wrong_kind(name, "an integer");
  return *v;
}

double PieceState::real(const std::string& name) const {
  const auto& s = scalar(name);
  if (const auto* v = std::get_if<double>(&s)) return *v;
  if (const auto* v = std::get_if<int64_t>(&s)) return static_cast<double>(*v);
  wrong_kind(name, "a number");
}

bool PieceState::flag(const std::string& name) const {
  const auto* v = std::get_if<bool>(&scalar(name));
  if (v == nullptr) wrong_kind(name, "true or false");
  return *v;
}

const std::string& PieceState::text(const std::string& name) const {
  const auto* v = std::get_if<std::string>(&scalar(name));
  if (v == nullptr) wrong_kind(name, "a string");
  return *v;
}

const torch::Tensor& PieceState::tensor(const std::string& name) const {
  const auto it = tensors.find(name);
  GA_CHECK(it != tensors.end(), "{}: missing tensor '{}.{}'", tensors_file, piece, name);
  return it->second;
}

int64_t PieceState::tensor_integer(const std::string& name) const {
  const auto& t = tensor(name);
  GA_CHECK(t.scalar_type() == torch::kLong && t.numel() == 1, "{} is not one int64", tensor_where(name));
  return t.item<int64_t>();
}

}  // namespace gradaccum::core
