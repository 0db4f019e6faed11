#include "gradaccum/models/sample_dropout.h"

#include <cmath>

#include "gradaccum/base/check.h"

namespace gradaccum::models {

namespace {
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ULL;
constexpr uint64_t kMix2 = 0x94D049BB133111EBULL;
constexpr int64_t kRadixBits = 16;

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * kMix1;
  z = (z ^ (z >> 27)) * kMix2;
  return z ^ (z >> 31);
}

int64_t as_signed(uint64_t v) { return static_cast<int64_t>(v); }

// z >> s as on uint64, for int64 tensors (whose >> keeps the sign).
torch::Tensor logical_shift_right(const torch::Tensor& z, int64_t s) {
  return z.bitwise_right_shift(s).bitwise_and_(as_signed((uint64_t{1} << (64 - s)) - 1));
}

// The same mixer on int64 tensors: their products wrap modulo 2^64 like uint64's.
torch::Tensor mix(torch::Tensor z) {
  z.bitwise_xor_(logical_shift_right(z, 30)).mul_(as_signed(kMix1));
  z.bitwise_xor_(logical_shift_right(z, 27)).mul_(as_signed(kMix2));
  return z.bitwise_xor_(logical_shift_right(z, 31));
}
}  // namespace

const base::EnumNames<DropoutRng>& dropout_rng_names() {
  static const base::EnumNames<DropoutRng> names{{DropoutRng::per_sample, "per_sample"},
                                                 {DropoutRng::libtorch, "libtorch"}};
  return names;
}

std::string to_string(DropoutRng rng) { return dropout_rng_names().name(rng); }

void check_dropout_probability(const std::string& key, double p) {
  GA_CHECK(std::isfinite(p) && p >= 0.0 && p < 1.0, "key '{}': a dropout probability must be in [0, 1), got {}", key,
           p);
}

torch::Tensor per_sample_dropout_scale(const torch::Tensor& x, double p, const core::SampleKeys& keys, int64_t site) {
  const int64_t rows = x.size(0), dims = x.dim() - 1;
  GA_CHECK(keys.ids.defined() && keys.ids.numel() == rows,
           "per-sample dropout: the micro-batch has {} rows and {} sample ids (model.dropout_rng per_sample needs "
           "the engine's sample keys)",
           rows, keys.ids.defined() ? keys.ids.numel() : 0);
  GA_CHECK(dims >= 1 && dims <= 3, "per-sample dropout: activations of {} dimensions (2 to 4 supported)", x.dim());
  const auto device_long = torch::TensorOptions().dtype(torch::kLong).device(x.device());
  // Each element's position within its sample, in radix 2^16: independent of the padded length.
  torch::Tensor position = torch::zeros({1}, device_long);
  for (int64_t d = 1; d <= dims; ++d) {
    GA_CHECK(x.size(d) <= (int64_t{1} << kRadixBits), "per-sample dropout: dimension {} of size {} exceeds 65536", d,
             x.size(d));
    position = position.unsqueeze(-1) * (int64_t{1} << kRadixBits) + torch::arange(x.size(d), device_long);
  }
  // The row's key: the run, the step and the site mixed on the host, then the sample's index.
  const uint64_t base =
      mix(mix(keys.seed ^ (static_cast<uint64_t>(site + 1) * kGolden)) + static_cast<uint64_t>(keys.step) * kGolden);
  std::vector<int64_t> row_shape(static_cast<size_t>(dims + 1), 1);
  row_shape[0] = rows;
  auto row = mix(keys.ids.to(device_long).mul(as_signed(kGolden)).add_(as_signed(base))).view(row_shape);
  // Counter = row key + (position + 1) · golden; its mixed top 24 bits are a uniform draw.
  auto z = mix(row + (position + 1).mul_(as_signed(kGolden)));
  const int64_t threshold = std::llround(p * static_cast<double>(1 << 24));
  auto kept = logical_shift_right(z, 40).ge_(threshold);
  return kept.to(x.scalar_type()).mul_(1.0 / (1.0 - p));
}

SampleDropoutImpl::SampleDropoutImpl(double p, int64_t site, DropoutRng rng) : p_(p), site_(site), rng_(rng) {
  check_dropout_probability("dropout", p);
}

torch::Tensor SampleDropoutImpl::forward(const torch::Tensor& x) {
  if (p_ == 0.0 || !is_training()) return x;
  if (rng_ == DropoutRng::libtorch) return torch::dropout(x, p_, /*train=*/true);
  return x * per_sample_dropout_scale(x, p_, keys_, site_);
}

SampleDropoutSites::SampleDropoutSites(torch::nn::Module& model) {
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (auto site = std::dynamic_pointer_cast<SampleDropoutImpl>(m)) sites_.push_back(std::move(site));
  }
}

void SampleDropoutSites::set_keys(const core::SampleKeys& keys) const {
  for (const auto& site : sites_) site->set_keys(keys);
}

}  // namespace gradaccum::models
