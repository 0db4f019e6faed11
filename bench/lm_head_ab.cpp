// The fused LM loss (models/chunked_cross_entropy.h) with the head's three
// products through OpenBLAS (custom kernel lm_head_openblas,
// kernels/openblas_gemm.h) against the same node on libtorch's BLAS, inside one
// process: forward + backward of one micro-batch's loss, the two paths round
// after round so that load on a shared machine hits both alike.
//
//   lm_head_ab [--threads 2] [--rounds 12] [--tokens 512] [--vocab 50257]
//              [--hidden 768] [--chunk-tokens 0]
//
// The defaults are GPT-2 small's head at bench/lm_throughput's gpt2-124m shape
// (2 × 256 tokens); --chunk-tokens 0 is CausalLm's automatic chunk on the CPU
// (64 MiB of float32 logits: 333 tokens at 50257). The first round is a warm-up
// and not counted. Prints one JSON line: per path the median, minimum and
// maximum milliseconds, the median of the round-by-round ratio openblas /
// libtorch, GFLOP/s of the three products at the medians, and the largest
// relative difference between the two paths' loss and gradients.
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "bench_support.h"
#include "gradaccum/base/check.h"
#include "gradaccum/kernels/custom_kernels.h"
#include "gradaccum/kernels/openblas_gemm.h"
#include "gradaccum/models/chunked_cross_entropy.h"

namespace {

using gradaccum::bench::max_relative;
using gradaccum::bench::median;
using gradaccum::bench::parse_count;
namespace kernels = gradaccum::kernels;
namespace models = gradaccum::models;
using Clock = std::chrono::steady_clock;

struct Options {
  int64_t threads = 2, rounds = 12, tokens = 512, vocab = 50257, hidden = 768, chunk_tokens = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    GA_CHECK(i + 1 < argc, "lm_head_ab: {} needs a value", key);
    const std::string value = argv[++i];
    if (key == "--threads") {
      o.threads = parse_count("lm_head_ab", key, value);
    } else if (key == "--rounds") {
      o.rounds = parse_count("lm_head_ab", key, value);
    } else if (key == "--tokens") {
      o.tokens = parse_count("lm_head_ab", key, value);
    } else if (key == "--vocab") {
      o.vocab = parse_count("lm_head_ab", key, value);
    } else if (key == "--hidden") {
      o.hidden = parse_count("lm_head_ab", key, value);
    } else if (key == "--chunk-tokens") {
      o.chunk_tokens = value == "0" ? 0 : parse_count("lm_head_ab", key, value);
    } else {
      GA_CHECK(false, "lm_head_ab: unknown option {}", key);
    }
  }
  GA_CHECK(o.rounds >= 2 && o.tokens >= 2 && o.vocab >= 1 && o.hidden >= 1,
           "lm_head_ab: need --rounds >= 2, --tokens >= 2 and positive sizes");
  if (o.chunk_tokens == 0) o.chunk_tokens = std::max<int64_t>(1, (int64_t{64} << 20) / (o.vocab * 4));
  return o;
}

struct Result {
  double ms;
  torch::Tensor loss, grad_hidden, grad_weight;
};

Result loss_forward_backward(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& labels,
                             int64_t chunk_tokens) {
  const auto h = hidden.detach().requires_grad_();
  const auto w = weight.detach().requires_grad_();
  const auto start = Clock::now();
  const auto loss = models::chunked_causal_lm_loss(h, w, labels, chunk_tokens);
  loss.sum.backward();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return {ms, loss.sum.detach(), h.grad(), w.grad()};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    torch::set_num_threads(static_cast<int>(o.threads));
    torch::manual_seed(0);
    const auto hidden = torch::randn({1, o.tokens, o.hidden});
    const auto weight = torch::randn({o.vocab, o.hidden}) * 0.02;
    const auto labels = torch::randint(0, o.vocab, {1, o.tokens}, torch::kLong);
    GA_CHECK(models::chunked_cross_entropy_uses_openblas(hidden, weight),
             "lm_head_ab: the loss does not route through OpenBLAS here (no OpenMP OpenBLAS loaded, "
             "or not preferred on this CPU: kernels/openblas_gemm.h)");
    const std::string routed_kernels = kernels::custom_kernels_description();
    const std::string without_openblas = kernels::custom_kernels_without(kernels::CustomKernel::lm_head_openblas);
    std::vector<double> openblas_ms, libtorch_ms, ratios;
    double loss_difference = 0.0, hidden_difference = 0.0, weight_difference = 0.0;
    for (int64_t round = 0; round < o.rounds; ++round) {
      kernels::set_custom_kernels(routed_kernels);
      const auto routed = loss_forward_backward(hidden, weight, labels, o.chunk_tokens);
      kernels::set_custom_kernels(without_openblas);
      const auto libtorch = loss_forward_backward(hidden, weight, labels, o.chunk_tokens);
      if (round == 0) {
        loss_difference = max_relative(routed.loss, libtorch.loss);
        hidden_difference = max_relative(routed.grad_hidden, libtorch.grad_hidden);
        weight_difference = max_relative(routed.grad_weight, libtorch.grad_weight);
        continue;
      }
      openblas_ms.push_back(routed.ms);
      libtorch_ms.push_back(libtorch.ms);
      ratios.push_back(routed.ms / libtorch.ms);
    }
    // The three products: logits, d/d hidden, d/d weight, 2 · tokens · vocab · hidden FLOPs each
    // (every position but the last is scored).
    const double gflop = 3.0 * 2.0 * static_cast<double>(o.tokens - 1) * o.vocab * o.hidden / 1e9;
    auto summary = [&](const std::vector<double>& v) {
      return fmt::format("{{\"median\": {:.1f}, \"min\": {:.1f}, \"max\": {:.1f}, \"gflops\": {:.1f}}}", median(v),
                         *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()),
                         gflop / (median(v) / 1e3));
    };
    std::cout << fmt::format(
                     "{{\"tokens\": {}, \"vocab\": {}, \"hidden\": {}, \"chunk_tokens\": {}, \"threads\": {}, "
                     "\"rounds\": {}, \"openblas_ms\": {}, \"libtorch_ms\": {}, \"openblas_over_libtorch\": {:.3f}, "
                     "\"max_rel_diff_loss\": {:.2e}, \"max_rel_diff_grad_hidden\": {:.2e}, "
                     "\"max_rel_diff_grad_weight\": {:.2e}, \"openblas\": \"{}\"}}",
                     o.tokens, o.vocab, o.hidden, o.chunk_tokens, o.threads, o.rounds - 1, summary(openblas_ms),
                     summary(libtorch_ms), median(ratios), loss_difference, hidden_difference, weight_difference,
                     kernels::openblas_config())
              << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
