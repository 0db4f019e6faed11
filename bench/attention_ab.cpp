// kernels::qkv_attention's fused CPU node against libtorch's attention
// (at::scaled_dot_product_attention, what custom_kernels without qkv_attention
// runs) inside one process: forward + backward of one layer's attention, the two
// paths round after round so that load on a shared machine hits both alike.
//
//   attention_ab [--threads 2] [--rounds 20] [--batch 1] [--time 512]
//                [--heads 16] [--head-dim 64] [--packing by_head|by_part]
//                [--bias alibi|none] [--padding 0]
//
// The defaults are one BLOOM-560m layer at seed 001's longest sequences: BLOOM's
// per-head packing, its ALiBi slopes as the key bias, a causal mask. --padding P
// left-pads every sequence by P tokens (a padding mask as well). The first round is
// a warm-up and not counted. Prints one JSON line: per path the median, minimum and
// maximum milliseconds, the median of the round-by-round ratio fused / libtorch,
// and the largest relative difference between the two paths' outputs and gradients.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "bench_support.h"
#include "gradaccum/base/check.h"
#include "gradaccum/kernels/custom_kernels.h"
#include "gradaccum/kernels/qkv_attention.h"
#include "gradaccum/models/bloom.h"
#include "gradaccum/models/decoder.h"

namespace {

using gradaccum::bench::max_relative;
using gradaccum::bench::median;
using gradaccum::bench::parse_count;
namespace kernels = gradaccum::kernels;
namespace models = gradaccum::models;
using Clock = std::chrono::steady_clock;

struct Options {
  int64_t threads = 2, rounds = 20, batch = 1, time = 512, heads = 16, head_dim = 64, padding = 0;
  kernels::QkvPacking packing = kernels::QkvPacking::by_head;
  bool alibi = true;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    GA_CHECK(i + 1 < argc, "attention_ab: {} needs a value", key);
    const std::string value = argv[++i];
    if (key == "--threads") {
      o.threads = parse_count("attention_ab", key, value);
    } else if (key == "--rounds") {
      o.rounds = parse_count("attention_ab", key, value);
    } else if (key == "--batch") {
      o.batch = parse_count("attention_ab", key, value);
    } else if (key == "--time") {
      o.time = parse_count("attention_ab", key, value);
    } else if (key == "--heads") {
      o.heads = parse_count("attention_ab", key, value);
    } else if (key == "--head-dim") {
      o.head_dim = parse_count("attention_ab", key, value);
    } else if (key == "--padding") {
      o.padding = parse_count("attention_ab", key, value);
    } else if (key == "--packing") {
      GA_CHECK(value == "by_head" || value == "by_part", "attention_ab: --packing '{}' is not by_head or by_part",
               value);
      o.packing = value == "by_head" ? kernels::QkvPacking::by_head : kernels::QkvPacking::by_part;
    } else if (key == "--bias") {
      GA_CHECK(value == "alibi" || value == "none", "attention_ab: --bias '{}' is not alibi or none", value);
      o.alibi = value == "alibi";
    } else {
      GA_CHECK(false, "attention_ab: unknown option {}", key);
    }
  }
  GA_CHECK(o.rounds >= 2 && o.batch >= 1 && o.time >= 1 && o.heads >= 1 && o.head_dim >= 1 && o.padding < o.time,
           "attention_ab: need --rounds >= 2, positive sizes and --padding < --time");
  return o;
}

struct Result {
  double ms;
  torch::Tensor y, grad;
};

Result forward_backward(const torch::Tensor& qkv, const torch::Tensor& allowed, const Options& o,
                        const kernels::QkvAttentionOptions& attention, const torch::Tensor& grad_y) {
  const auto x = qkv.detach().requires_grad_();
  const auto start = Clock::now();
  const auto y = kernels::qkv_attention(x, o.heads, allowed, attention);
  y.backward(grad_y);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return {ms, y.detach(), x.grad()};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    torch::set_num_threads(static_cast<int>(o.threads));
    torch::manual_seed(0);
    const int64_t channels = o.heads * o.head_dim;
    const auto qkv = torch::randn({o.batch, o.time, 3 * channels});
    const auto grad_y = torch::randn({o.batch, o.time, channels});
    auto mask = torch::ones({o.batch, o.time}, torch::kLong);
    mask.slice(1, 0, o.padding).zero_();
    const auto ids = torch::zeros({o.batch, o.time}, torch::kLong);
    const auto allowed = models::causal_attention_allowed(ids, o.padding > 0 ? mask : torch::Tensor());
    const auto key_bias =
        o.alibi ? models::bloom_alibi(o.padding > 0 ? mask : torch::Tensor(), o.time, o.heads, torch::kFloat)
                : torch::Tensor();
    const kernels::QkvAttentionOptions attention{o.packing, key_bias};
    GA_CHECK(kernels::qkv_attention_fuses(qkv, o.heads, allowed, attention),
             "attention_ab: the fused path does not take these inputs (custom_kernels, BLAS)");
    const std::string fused_kernels = kernels::custom_kernels_description();
    std::vector<double> fused_ms, libtorch_ms, ratios;
    double value_difference = 0.0, grad_difference = 0.0;
    for (int64_t round = 0; round < o.rounds; ++round) {
      kernels::set_custom_kernels(fused_kernels);
      const auto fused = forward_backward(qkv, allowed, o, attention, grad_y);
      kernels::set_custom_kernels("none");
      const auto libtorch = forward_backward(qkv, allowed, o, attention, grad_y);
      if (round == 0) {
        value_difference = max_relative(fused.y, libtorch.y);
        grad_difference = max_relative(fused.grad, libtorch.grad);
        continue;
      }
      fused_ms.push_back(fused.ms);
      libtorch_ms.push_back(libtorch.ms);
      ratios.push_back(fused.ms / libtorch.ms);
    }
    auto summary = [](const std::vector<double>& v) {
      return fmt::format("{{\"median\": {:.2f}, \"min\": {:.2f}, \"max\": {:.2f}}}", median(v),
                         *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
    };
    std::cout << fmt::format(
                     "{{\"shape\": [{}, {}, {}, {}], \"packing\": \"{}\", \"bias\": \"{}\", \"padding\": {}, "
                     "\"threads\": {}, \"rounds\": {}, \"fused_ms\": {}, \"libtorch_ms\": {}, "
                     "\"fused_over_libtorch\": {:.3f}, \"max_rel_diff_y\": {:.2e}, \"max_rel_diff_grad\": {:.2e}}}",
                     o.batch, o.time, o.heads, o.head_dim,
                     o.packing == kernels::QkvPacking::by_head ? "by_head" : "by_part", o.alibi ? "alibi" : "none",
                     o.padding, o.threads, o.rounds - 1, summary(fused_ms), summary(libtorch_ms), median(ratios),
                     value_difference, grad_difference)
              << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
