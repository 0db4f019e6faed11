#include "gradaccum/data/fashion_mnist.h"

#include <fmt/ranges.h>

#include <filesystem>

#include "gradaccum/base/check.h"
#include "gradaccum/data/gather_rows.h"
#include "gradaccum/data/idx_file.h"

namespace gradaccum::data {

namespace {
// Statistics of the 60000 training images (pixel / 255).
constexpr double kMean = 0.2860;
constexpr double kStd = 0.3530;
}  // namespace

FashionMnist::FashionMnist(const std::string& directory, const std::string& split, int64_t limit) {
  GA_CHECK(split == "train" || split == "test", "fashion_mnist: unknown split '{}'", split);
  const std::string prefix = split == "train" ? "train" : "t10k";
  const auto images_path = std::filesystem::path(directory) / (prefix + "-images-idx3-ubyte.gz");
  const auto labels_path = std::filesystem::path(directory) / (prefix + "-labels-idx1-ubyte.gz");
  for (const auto& p : {images_path, labels_path}) {
    GA_CHECK(std::filesystem::exists(p),
             "{}: missing; install the Fashion-MNIST files with `apt-get install "
             "dataset-fashion-mnist` (or run scripts/setup.sh)",
             p.string());
  }
  auto images = read_idx_file(images_path.string());
  auto labels = read_idx_file(labels_path.string());
  GA_CHECK(images.dim() == 3 && images.size(1) == 28 && images.size(2) == 28, "{}: expected [n, 28, 28] images, got {}",
           images_path.string(), fmt::format("{}", fmt::join(images.sizes(), "x")));
  GA_CHECK(labels.dim() == 1 && labels.size(0) == images.size(0), "{}: {} labels for {} images", labels_path.string(),
           labels.size(0), images.size(0));
  GA_CHECK(labels.max().item<int64_t>() < 10, "{}: label out of range 0..9", labels_path.string());
  const int64_t n = limit > 0 ? std::min(limit, images.size(0)) : images.size(0);
  // clone(): a slice would keep the whole file's storage alive under train_limit.
  images_ = images.slice(0, 0, n).unsqueeze(1).clone();
  labels_ = labels.slice(0, 0, n).to(torch::kLong);
}

core::Batch FashionMnist::get(const torch::Tensor& indices, torch::ScalarType dtype) const {
  core::Batch batch;
  batch.input = gather_rows(images_, indices).to(dtype).sub_(kMean * 255.0).div_(kStd * 255.0);
  batch.target = gather_rows(labels_, indices);
  batch.samples = indices.size(0);
  return batch;
}

}  // namespace gradaccum::data
