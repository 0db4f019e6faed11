// What a run trains on: the datasets and the model its configuration names
// (data.type × model.type), assembled in one place so that `train`, `plan` and
// `verify` build the same thing. The data types are a table (data_types()):
// adding one is one entry there, as adding a model is one in models/model_types.h.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradaccum/core/trainable.h"
#include "gradaccum/data/tokenizer.h"
#include "gradaccum/io/config.h"
#include "gradaccum/models/built_model.h"
#include "gradaccum/models/model_types.h"

namespace gradaccum::io {

struct Workload {
  std::shared_ptr<core::Dataset> train;
  std::shared_ptr<core::Dataset> eval;  // null: no evaluation
  std::shared_ptr<core::Dataset> test;  // null: none; else evaluated once, at the end of training
  models::BuiltModel model;
  bool items_are_tokens = false;  // language models count tokens
  std::string description;        // one line about the data, for the log
  std::optional<data::Tokenizer> tokenizer;
  int64_t num_labels = 0;                // classes of a classification task; 0: a causal LM
  std::vector<std::string> label_names;  // class id -> name (the model's id2label); empty: LABEL_0 ...
};

struct DataType {
  std::string name;
  models::ModelFamily family;  // the models it feeds: images or token ids
  std::string help;            // one line for the configuration reference
  // Loads the training data (and, when `with_eval`, the evaluation data) into `w`: train, eval,
  // test (types with a test split), description, tokenizer (tokenized types) and num_labels.
  std::function<void(const TrainConfig& config, bool with_eval, Workload& w)> load;
};

// Every data type, in the order the reference lists them.
const std::vector<DataType>& data_types();

// The entry named `name`; a gradaccum::Error naming the key and the choices otherwise.
const DataType& data_type(const std::string& name);

// Builds data and model; `with_eval` false skips loading the eval set (ranks
// other than 0). Throws gradaccum::Error on bad input, before any output.
Workload make_workload(const TrainConfig& config, bool with_eval);

// The tokenizer to use: `configured`, else $GRADACCUM_TOKENIZER_DIR, else the
// setup script's GPT-2 files; an error names a directory that does not exist.
std::string tokenizer_directory(const std::string& configured);

// The files a tokenizer was loaded from (gpt2.tiktoken, tokenizer.json, or encoder.json
// and vocab.bpe), to be copied beside a saved model; for a GGUF file's tokenizer, its
// tokenizer.json (data/gguf_tokenizer.h) written into a temporary directory that is removed
// when the process exits.
std::vector<std::string> tokenizer_files(const data::Tokenizer& tokenizer);

}  // namespace gradaccum::io
