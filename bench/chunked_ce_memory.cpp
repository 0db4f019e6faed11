// Peak memory of the causal-LM loss with and without chunking (issue 5, item
// 4): one forward + backward of the tied LM head and cross-entropy on random
// float32 hidden states, plain (causal_lm_loss on full logits) or
// chunked_causal_lm_loss with a given chunk size.
//
//   chunked_ce_memory plain|CHUNK_TOKENS [--tokens 4096] [--vocab 50257] [--hidden 768]
//
// Run each mode in its own process. Once the inputs are allocated, the peak
// (VmHWM in /proc/self/status) is reset to the current RSS through
// /proc/self/clear_refs, so the setup's temporaries do not count (peak_reset
// false: the kernel refused, and the peak before is the setup's). Prints one
// JSON line: the RSS before the loss, the peak after forward + backward, and
// their difference — what the loss costs, the weight's gradient included.
// The full float32 logits of 4096 tokens × 50257 are 786 MiB.
//
// CHUNK_TOKENS > 0 (the fused loss computes the head's gradients in its
// forward, chunked_cross_entropy.h). Measured here (2026-11-22, 1 thread,
// hidden 768, float32; loss_peak_mib, BENCHMARKS.md): plain 2364 MiB in 40.5 s
// (logits, log_softmax and their gradient: 3 × 786, plus the weight's gradient
// 147), chunk 333 (the automatic size at this vocabulary) 296 MiB in 32.0 s,
// chunk 1024 568 MiB, chunk 256 267 MiB.
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "bench_support.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/chunked_cross_entropy.h"

namespace {

// A field of /proc/self/status (VmRSS, VmHWM) in MiB.
double status_mib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  }
  return 0.0;
}

// Resets VmHWM to the current RSS (Linux ≥ 4.0), so the setup's temporaries do
// not count as the loss's peak.
bool reset_peak_rss() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  clear_refs << "5";
  return static_cast<bool>(clear_refs);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: chunked_ce_memory plain|CHUNK_TOKENS [--tokens N] [--vocab V] [--hidden H]\n";
    return 2;
  }
  const std::string mode = argv[1];
  int64_t chunk = 0;  // 0 = plain
  int64_t tokens = 4096, vocab = 50257, hidden_size = 768;
  try {
    if (mode != "plain") {
      chunk = gradaccum::bench::parse_count("chunked_ce_memory", "CHUNK_TOKENS", mode);
      GA_CHECK(chunk > 0, "chunked_ce_memory: CHUNK_TOKENS must be > 0 (or plain), got 0");
    }
  } catch (const gradaccum::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    int64_t value = 0;
    try {
      value = gradaccum::bench::parse_count("chunked_ce_memory", key, argv[i + 1]);
    } catch (const gradaccum::Error& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
    if (key == "--tokens") {
      tokens = value;
    } else if (key == "--vocab") {
      vocab = value;
    } else if (key == "--hidden") {
      hidden_size = value;
    } else {
      std::cerr << "chunked_ce_memory: unknown option " << key << "\n";
      return 2;
    }
  }
  torch::set_num_threads(1);  // a shared machine; the memory does not depend on it

  auto generator = at::make_generator<at::CPUGeneratorImpl>(1);
  // One row of tokens + 1 positions: after the shift, exactly `tokens` targets.
  auto hidden = torch::randn({1, tokens + 1, hidden_size}, generator).requires_grad_(true);
  auto weight = (torch::randn({vocab, hidden_size}, generator) * 0.02).requires_grad_(true);
  auto labels = torch::randint(0, vocab, {1, tokens + 1}, generator, torch::kLong);
  const bool reset = reset_peak_rss();
  const double before = status_mib(reset ? "VmRSS" : "VmHWM");

  const auto start = std::chrono::steady_clock::now();
  auto loss = chunk == 0 ? gradaccum::models::causal_lm_loss(torch::nn::functional::linear(hidden, weight), labels)
                         : gradaccum::models::chunked_causal_lm_loss(hidden, weight, labels, chunk);
  loss.sum.backward();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double after = status_mib("VmHWM");

  std::cout << fmt::format(
                   "{{\"mode\": \"{}\", \"tokens\": {}, \"vocab\": {}, \"hidden\": {}, "
                   "\"loss\": {:.6f}, \"rss_before_mib\": {:.1f}, \"peak_after_mib\": {:.1f}, "
                   "\"loss_peak_mib\": {:.1f}, \"peak_reset\": {}, \"seconds\": {:.2f}}}",
                   mode, tokens, vocab, hidden_size, loss.sum.item<double>() / tokens, before, after, after - before,
                   reset, seconds)
            << std::endl;
  return 0;
}
