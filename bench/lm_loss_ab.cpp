// The causal-LM loss paths compared inside one process (issue 3, item 7; issue
// 5, item 4): one micro-step — forward, loss, backward — of the ~3.4M-parameter
// GPT-2 of bench/lm_throughput.cpp (vocab 8192, context 128, n_embd 192,
// 4 layers, 3 heads, micro-batch 8 unless --micro-batch) with each `loss_chunk_tokens` setting in
// turn, round after round, so that load on a shared machine hits every setting
// alike (the machines here vary up to 1.7x between identical processes).
//
//   lm_loss_ab [--threads 2] [--rounds 20] [--mixed-precision no|bf16]
//              [--chunks plain,0,256] [--micro-batch 8] [--trace FILE]
//
// `plain` is the unfused loss (the full logits from the LM head, then
// causal_lm_loss: log_softmax + nll and their backward, as the Python loop
// does); 0 and K > 0 are the engine's loss_chunk_tokens settings of the fused
// loss, which computes the LM head's gradients in its forward
// (models/chunked_cross_entropy.h): 0 = automatic, here one chunk per
// micro-batch. The first round is a warm-up and not counted. Prints one JSON
// line: per setting the median, minimum and maximum milliseconds per
// micro-step, and the median ratio to the first setting taken round by round.
// --trace FILE also writes libtorch's profiler trace of the last round
// (chrome://tracing format; every op with its duration) to FILE.
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_support.h"
#include "gradaccum/base/check.h"
#include "gradaccum/core/mixed_precision.h"
#include "gradaccum/kernels/heap_retention.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/gpt2.h"

namespace {

using gradaccum::bench::median;
using gradaccum::bench::parse_count;

namespace core = gradaccum::core;
namespace models = gradaccum::models;
using Clock = std::chrono::steady_clock;

constexpr int64_t kPlain = -1;  // --chunks "plain"

struct Options {
  int64_t threads = 2;
  int64_t rounds = 20;
  int64_t micro_batch = 8;
  core::MixedPrecision precision = core::MixedPrecision::none;
  std::vector<int64_t> chunks = {kPlain, 0, 256};
  std::string trace;
};

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    GA_CHECK(i + 1 < argc, "lm_loss_ab: option {} needs a value", key);
    const std::string value = argv[i + 1];
    if (key == "--threads") {
      o.threads = parse_count("lm_loss_ab", key, value);
    } else if (key == "--rounds") {
      o.rounds = parse_count("lm_loss_ab", key, value);
    } else if (key == "--micro-batch") {
      o.micro_batch = parse_count("lm_loss_ab", key, value);
    } else if (key == "--mixed-precision") {
      o.precision = core::mixed_precision_names().parse(value, "--mixed-precision");
    } else if (key == "--trace") {
      o.trace = value;
    } else if (key == "--chunks") {
      o.chunks.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');) {
        o.chunks.push_back(item == "plain" ? kPlain : parse_count("lm_loss_ab", key, item));
      }
    } else {
      GA_CHECK(false, "lm_loss_ab: unknown option {}", key);
    }
  }
  GA_CHECK(o.threads >= 1 && o.rounds >= 2 && o.micro_batch >= 1 && !o.chunks.empty(),
           "lm_loss_ab: needs --threads >= 1, --rounds >= 2, --micro-batch >= 1 and at least one "
           "chunk setting");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  gradaccum::kernels::retain_freed_heap();  // as gradaccum's main does
  Options opts;
  try {
    opts = parse_options(argc, argv);
  } catch (const gradaccum::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  at::set_num_threads(static_cast<int>(opts.threads));
  torch::manual_seed(42);
  models::Gpt2Config config;
  config.vocab_size = 8192;
  config.n_positions = 128;
  config.n_embd = 192;
  config.n_layer = 4;
  config.n_head = 3;
  models::Gpt2LmHeadModel net(config);
  models::CausalLm model(net);
  auto generator = at::detail::createCPUGenerator(1234);
  core::Batch batch;
  batch.input = torch::randint(config.vocab_size, {opts.micro_batch, config.n_positions}, generator, torch::kLong);
  batch.target = batch.input;
  batch.samples = opts.micro_batch;

  const torch::Device device(torch::kCPU);
  std::vector<std::vector<double>> ms(opts.chunks.size());
  std::vector<double> losses(opts.chunks.size());
  for (int64_t round = 0; round < opts.rounds; ++round) {
    std::unique_ptr<torch::autograd::profiler::RecordProfile> trace;
    if (!opts.trace.empty() && round == opts.rounds - 1) {
      trace = std::make_unique<torch::autograd::profiler::RecordProfile>(opts.trace);
    }
    for (size_t i = 0; i < opts.chunks.size(); ++i) {
      const bool plain = opts.chunks[i] == kPlain;
      if (!plain) model.set_loss_chunk_tokens(opts.chunks[i]);
      const auto t0 = Clock::now();
      core::LossSum loss;
      {
        core::AutocastScope autocast(opts.precision, device);
        loss = plain ? models::causal_lm_loss(net->forward(batch.input), batch.target) : model.loss(batch);
      }
      (loss.sum / loss.count).backward();
      const double elapsed = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      losses[i] = (loss.sum / loss.count).item<double>();
      net->zero_grad();
      if (round > 0) ms[i].push_back(elapsed);
    }
  }
  std::vector<std::string> rows;
  for (size_t i = 0; i < opts.chunks.size(); ++i) {
    std::vector<double> ratio;
    for (size_t r = 0; r < ms[i].size(); ++r) ratio.push_back(ms[i][r] / ms[0][r]);
    rows.push_back(fmt::format(
        "{{\"path\": \"{}\", \"ms_median\": {:.2f}, \"ms_min\": {:.2f}, \"ms_max\": "
        "{:.2f}, \"ratio_to_first\": {:.3f}, \"loss\": {:.6f}}}",
        opts.chunks[i] == kPlain ? std::string("plain") : fmt::format("loss_chunk_tokens {}", opts.chunks[i]),
        median(ms[i]), *std::min_element(ms[i].begin(), ms[i].end()), *std::max_element(ms[i].begin(), ms[i].end()),
        median(ratio), losses[i]));
  }
  fmt::print(
      "{{\"program\": \"lm_loss_ab\", \"mixed_precision\": \"{}\", \"threads\": {}, "
      "\"micro_batch\": {}, \"rounds\": {}, \"settings\": [{}]}}\n",
      core::to_string(opts.precision), opts.threads, opts.micro_batch, opts.rounds - 1, fmt::join(rows, ", "));
  return 0;
}
