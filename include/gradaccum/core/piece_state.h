// What one piece of the trainer keeps in a checkpoint, under names of its own.
//
// A piece (window_feature.h; the Trainer's geometry, saved_geometry.h) saves its state into a
// PieceState and reads it back from one, and nothing else knows its fields: io/checkpoint writes
// every piece's scalars into trainer_state.json and its tensors into the rank's own file, by
// name, without knowing what they mean. Scalars are the same on every rank (rank 0's are
// written); tensors are this rank's own.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <variant>

namespace gradaccum::core {

class PieceState {
 public:
  using Scalar = std::variant<int64_t, double, bool, std::string>;

  // The piece's save.
  void set_integer(const std::string& name, int64_t value) { scalars[name] = value; }
  void set_real(const std::string& name, double value) { scalars[name] = value; }
  void set_flag(const std::string& name, bool value) { scalars[name] = value; }
  void set_text(const std::string& name, std::string value) { scalars[name] = std::move(value); }
  void set_tensor(const std::string& name, torch::Tensor value) { tensors[name] = std::move(value); }

  // The piece's restore. A field that is missing or of another kind is a one-line
  // gradaccum::Error naming the file it was read from and the field ("<piece>.<name>").
  bool has(const std::string& name) const { return scalars.count(name) > 0; }
  int64_t integer(const std::string& name) const;
  double real(const std::string& name) const;  // an integer is read as a real as well
  bool flag(const std::string& name) const;
  const std::string& text(const std::string& name) const;
  bool has_tensor(const std::string& name) const { return tensors.count(name) > 0; }
  const torch::Tensor& tensor(const std::string& name) const;
  // A tensor that holds one int64.
  int64_t tensor_integer(const std::string& name) const;
  // "FILE: field 'piece.name'" and "FILE: tensor 'piece.name'": where a piece's own message about
  // one of its fields begins.
  std::string field_where(const std::string& name) const;
  std::string tensor_where(const std::string& name) const;

  std::map<std::string, Scalar> scalars;
  std::map<std::string, torch::Tensor> tensors;

  // For messages, set by TrainingState::saved_piece: the piece's name and the files its scalars
  // and its tensors were read from.
  std::string piece = "?";
  std::string scalars_file = "checkpoint";
  std::string tensors_file = "checkpoint";

 private:
  const Scalar& scalar(const std::string& name) const;
  [[noreturn]] void wrong_kind(const std::string& name, const char* expected) const;
};

}  // namespace gradaccum::core
