// What a run trains on: the datasets and the model its configuration names
// (data.type × model.type), assembled in one place so that `train` and
// `verify` build the same thing.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradaccum/core/trainable.h"
#include "gradaccum/data/tokenizer.h"
#include "gradaccum/io/config.h"
#include "gradaccum/models/built_model.h"

namespace gradaccum::cli {

struct Workload {
  std::shared_ptr<core::Dataset> train;
  std::shared_ptr<core::Dataset> eval;  // null: no evaluation
  models::BuiltModel model;
  bool items_are_tokens = false;  // language models count tokens
  std::string description;        // one line about the data, for the log
  std::optional<data::Tokenizer> tokenizer;
};

// Builds data and model; `with_eval` false skips loading the eval set (ranks
// other than 0). Throws gradaccum::Error on bad input, before any output.
Workload make_workload(const io::TrainConfig& config, bool with_eval);

// The tokenizer to use: `configured`, else $GRADACCUM_TOKENIZER_DIR, else the
// setup script's GPT-2 files; an error names a directory that does not exist.
std::string tokenizer_directory(const std::string& configured);

// The files a tokenizer was loaded from (gpt2.tiktoken, tokenizer.json, or encoder.json
// and vocab.bpe), to be copied beside a saved model.
std::vector<std::string> tokenizer_files(const data::Tokenizer& tokenizer);

}  // namespace gradaccum::cli
