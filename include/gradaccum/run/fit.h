// A whole training run around core::Trainer, callable from a program of one's own: what the
// `gradaccum train` command does after reading its configuration.
//
//   1. The process's settings (libtorch's threads, the custom kernels, CPU autocast's matmul
//      route) are the caller's ProcessSetup (run/process_setup.h), or, given none, one fit makes
//      from `options` for the call and undoes when it returns.
//   2. Data parallel when the environment names a job (torchrun, mpirun, run::launch_local):
//      a process group (Gloo on the CPU, NCCL on CUDA), the same configuration on every rank,
//      the gradient sync, ZeRO-1 when asked.
//   3. Resume from a checkpoint ("latest" or a directory): weights, optimizer, generator, position,
//      and a window saved half-way through. A fresh run into an output_dir that holds checkpoints
//      is refused unless overwrite_output_dir. Everything bad input can fail is checked (the
//      checkpoint loaded into the model and optimizer included) before anything is written.
//   4. Rank 0's outputs in output_dir: run.json (the run's id, io/checkpoint.h), config.yaml,
//      metrics.jsonl, summary.json, grad_flow.jsonl, TensorBoard events, the console; temporaries
//      a crash left there are removed first. Other ranks write rank<R>.json (their memory).
//   5. Checkpoints every save_steps and at the end (save_total_limit kept); SIGTERM / SIGINT save the
//      window in flight and stop (their handlers installed for the training and the final save,
//      the previous ones put back after).
//   6. The final model in output_dir/final: model.safetensors, and config.json when the model has one
//      (an HF checkpoint for GPT-2 and BLOOM; PEFT's adapter files for a LoRA run, ModelFiles),
//      with `final_files` beside them; published as a
//      checkpoint is (a temporary directory, fsynced, renamed), so final/ is whole or absent.
//   7. The test split, when given, evaluated once into summary.json.
//
// Exactness is the Trainer's: fit() adds no arithmetic of its own.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gradaccum/core/trainable.h"
#include "gradaccum/core/trainer.h"
#include "gradaccum/core/training_observer.h"
#include "gradaccum/dist/environment.h"
#include "gradaccum/io/run_settings.h"
#include "gradaccum/run/process_setup.h"

namespace gradaccum::models {
struct BuiltModel;
}

namespace gradaccum::run {

// The settings of the configuration's key table (io/run_settings.h) and the trainer's options,
// with what a program adds of its own.
struct RunOptions : io::RunSettings {
  core::TrainerOptions trainer;   // the accumulation, optimizer, schedule, precision, device
  bool console = true;            // rank 0's progress lines on stdout
  bool items_are_tokens = false;  // the metrics call items tokens (language models) or samples
  // The run's configuration as text: output_dir/config.yaml, stored in every checkpoint, and
  // compared across ranks (they must agree). "" writes no config.yaml.
  std::string description;
  std::string data_description;  // one console line about the data ("" = none)
  // Files copied into final/ beside the model (a language model's tokenizer files).
  std::vector<std::string> final_files;
  // Evaluated once, by every rank, after a run that ends (not one stopped early); rank 0 writes
  // summary.json's test_loss, test_accuracy, test_samples, ... once final/ is saved. Null: none.
  const core::Dataset* test_data = nullptr;
};

// How the model's weights are named in files. Default (empty functions): the module's parameter
// and buffer names (models/module_tensors.h) and no config.json.
struct ModelFiles {
  std::function<std::vector<std::pair<std::string, torch::Tensor>>()> weights;
  std::function<void(const std::vector<std::pair<std::string, torch::Tensor>>&, const std::string& what)> load;
  nlohmann::json config;  // non-null: final/ is an HF checkpoint with this config.json
  // The files' names in checkpoints and final/ (a LoRA run's: PEFT's adapter files).
  std::string weights_file = "model.safetensors";
  std::string config_file = "config.json";
};

// A GPT-2, BLOOM or image model of the program's model factory, with HF's names for the former;
// a model with LoRA adapters as PEFT's adapter_model.safetensors and adapter_config.json.
ModelFiles model_files(models::BuiltModel& model);

struct RunResult {
  core::TrainSummary summary;
  int64_t rank = 0;
  int64_t world_size = 1;
  std::string final_dir;                 // output_dir/final on rank 0 of a run that ended; else ""
  std::string last_checkpoint;           // the newest checkpoint this process saved ("" if none)
  std::optional<core::EvalRecord> test;  // RunOptions::test_data's figures
};

// Trains `model` on `train_data` (every rank passes the whole dataset: the windows say which
// samples each rank reads), evaluating on `eval_data` on rank 0 (may be null; the other ranks may
// pass null too, except under zero_stage 3, where they gather the weights with rank 0 for each
// evaluation and so pass what rank 0 passes). `observer`, when
// given, sees every event beside the outputs. `process`: the caller's set-up, kept as it is (null:
// fit's own, from `options`, for the call). `env`: this process's place in the job. Bad options, a
// bad checkpoint or a failing rank throw gradaccum::Error naming the cause, before anything is
// written where possible.
RunResult fit(const RunOptions& options, core::Trainable& model, const core::Dataset& train_data,
              const core::Dataset* eval_data = nullptr, const ModelFiles& files = {},
              core::TrainingObserver* observer = nullptr, const ProcessSetup* process = nullptr,
              const dist::DistEnvironment& env = dist::read_environment());

}  // namespace gradaccum::run
