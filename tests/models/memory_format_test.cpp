// model.memory_format: the image networks' activations in channels-last layout. The layer
// restrides a batch (also the one-channel batch that Tensor::contiguous would leave alone), the
// layout reaches the convolutions, and nothing outside the network sees it: the same parameter
// names, gradients in the default layout, the same logits and gradients as the default layout
// (float64), and a window's gradient still independent of how it is cut into micro-batches.
#include "gradaccum/models/memory_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradaccum/core/loss_normalizer.h"
#include "gradaccum/models/networks.h"
#include "gradaccum/models/tasks.h"
#include "test_support.h"

namespace memory_format_test {

using gradaccum::core::LossNormalization;
using gradaccum::models::Classifier;
using gradaccum::models::memory_format_names;
using gradaccum::models::MemoryFormat;
using gradaccum::models::MemoryFormatLayer;
using gradaccum::models::NormKind;
using gradaccum::models::small_cnn;
using gradaccum::models::small_resnet;
using gradaccum::testing::accumulate_window;
using gradaccum::testing::error_of;
using gradaccum::testing::flat_grads;
using gradaccum::testing::max_relative_difference;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

torch::nn::Sequential network(const std::string& type, MemoryFormat format, NormKind norm = NormKind::group) {
  torch::manual_seed(7);  // the same weights for every format
  auto net = type == "cnn" ? small_cnn({8, 16}, 32, 10, norm, 4, 0.0, gradaccum::models::DropoutRng::per_sample, format)
                           : small_resnet({8, 16}, 10, norm, 4, format);
  net->to(torch::kDouble);
  return net;
}

std::vector<std::string> parameter_names(torch::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& item : m.named_parameters()) names.push_back(item.key());
  return names;
}

TEST(MemoryFormat, TheLayerRestridesEvenAOneChannelBatch) {
  const auto x = torch::randn({4, 1, 28, 28});
  // libtorch calls this batch channels-last contiguous already and would hand it back unchanged.
  ASSERT_TRUE(x.is_contiguous(at::MemoryFormat::ChannelsLast));
  ASSERT_EQ(x.contiguous(at::MemoryFormat::ChannelsLast).strides(), x.strides());

  MemoryFormatLayer layer(MemoryFormat::channels_last);
  const auto y = layer->forward(x);
  EXPECT_THAT(y.strides(), ElementsAre(784, 1, 28, 1));
  EXPECT_TRUE(torch::equal(y, x));
  EXPECT_EQ(layer->forward(y).data_ptr(), y.data_ptr());  // already laid out: no copy

  const auto wide = torch::randn({2, 3, 5, 7});
  EXPECT_THAT(layer->forward(wide).strides(), ElementsAre(105, 1, 21, 3));
  EXPECT_TRUE(torch::equal(layer->forward(wide), wide));

  EXPECT_THAT(MemoryFormatLayer(MemoryFormat::automatic)->forward(x).strides(), ElementsAre(784, 1, 28, 1));
  const auto one = torch::randn({1, 1, 28, 28});  // auto keeps a single image in NCHW
  EXPECT_EQ(MemoryFormatLayer(MemoryFormat::automatic)->forward(one).data_ptr(), one.data_ptr());
  EXPECT_THAT(layer->forward(torch::randn({1, 3, 5, 7})).strides(), ElementsAre(105, 1, 21, 3));
  EXPECT_EQ(MemoryFormatLayer(MemoryFormat::contiguous)->forward(x).data_ptr(), x.data_ptr());
  const auto flat = torch::randn({4, 784});
  EXPECT_EQ(layer->forward(flat).data_ptr(), flat.data_ptr());
}

TEST(MemoryFormat, TheConvolutionsComputeChannelsLastAndTheParametersKeepTheirLayout) {
  auto net = network("cnn", MemoryFormat::channels_last);
  net->to(torch::kFloat);
  const auto x = torch::randn({4, 1, 28, 28});
  // What conv0 receives from the memory_format layer, and what it returns.
  auto* conv0 = net->named_children()["conv0"]->as<torch::nn::Conv2dImpl>();
  ASSERT_NE(conv0, nullptr);
  const auto first = conv0->forward(net->named_children()["memory_format"]->as<MemoryFormatLayer>()->forward(x));
  EXPECT_EQ(first.suggest_memory_format(), at::MemoryFormat::ChannelsLast);

  torch::nn::functional::cross_entropy(net->forward(x), torch::randint(10, {4}), {}).backward();
  for (const auto& p : net->named_parameters()) {
    EXPECT_TRUE(p.value().is_contiguous()) << p.key();
    EXPECT_TRUE(p.value().grad().is_contiguous()) << p.key();
  }
}

TEST(MemoryFormat, ChannelsLastTrainsTheSameNetworkInFloat64) {
  for (const std::string type : {"cnn", "resnet"}) {
    for (const auto norm : {NormKind::group, NormKind::batch}) {
      auto plain = network(type, MemoryFormat::contiguous, norm);
      auto last = network(type, MemoryFormat::channels_last, norm);
      EXPECT_EQ(parameter_names(*plain), parameter_names(*last)) << type;
      EXPECT_EQ(plain->named_buffers().keys(), last->named_buffers().keys()) << type;

      torch::manual_seed(3);
      const auto x = torch::randn({12, 1, 28, 28}, torch::kDouble);
      const auto y = torch::randint(10, {12});
      const auto loss_plain = torch::nn::functional::cross_entropy(plain->forward(x), y);
      const auto loss_last = torch::nn::functional::cross_entropy(last->forward(x), y);
      loss_plain.backward();
      loss_last.backward();
      EXPECT_LT(max_relative_difference(loss_last.detach(), loss_plain.detach()), 1e-13) << type;
      EXPECT_LT(max_relative_difference(flat_grads(*last), flat_grads(*plain)), 1e-12) << type;
    }
  }
}

TEST(MemoryFormat, AWindowsGradientDoesNotDependOnItsCutInChannelsLast) {
  torch::manual_seed(5);
  const auto x = torch::randn({16, 1, 28, 28}, torch::kDouble);
  const auto y = torch::randint(10, {16});
  // auto mixes layouts inside a window: its 1 of 1 + 3 + 5 + 7 runs in NCHW.
  for (const auto& [type, format] :
       std::vector<std::pair<std::string, MemoryFormat>>{{"cnn", MemoryFormat::channels_last},
                                                         {"resnet", MemoryFormat::channels_last},
                                                         {"cnn", MemoryFormat::automatic}}) {
    Classifier model(network(type, format));
    const double full_loss = accumulate_window(model, x, y, {16}, LossNormalization::window, 1);
    const auto full = flat_grads(model.module());
    for (const auto& splits : std::vector<std::vector<int64_t>>{{4, 4, 4, 4}, {1, 3, 5, 7}, {8, 8}}) {
      const double loss = accumulate_window(model, x, y, splits, LossNormalization::window, 1);
      EXPECT_NEAR(loss, full_loss, 1e-15 * std::abs(full_loss)) << type;
      // The largest difference is in the convolutions' weight gradients: each element sums
      // 28 × 28 products per image in an order oneDNN picks by batch size and ISA. With its
      // AVX-512 kernels they differ by < 1e-15; with its AVX2 kernels (an AVX2 EPYC) by
      // 1.4e-15 to 4.1e-15, libtorch's own GroupNorm and the engine's alike.
      EXPECT_LT(max_relative_difference(flat_grads(model.module()), full), 1e-14) << type << " " << splits.size();
    }
  }
}

TEST(MemoryFormat, NamesAndErrors) {
  const auto& names = memory_format_names();
  EXPECT_EQ(names.parse("auto", "model.memory_format"), MemoryFormat::automatic);
  EXPECT_EQ(names.parse("channels_last", "model.memory_format"), MemoryFormat::channels_last);
  EXPECT_EQ(names.parse("contiguous", "model.memory_format"), MemoryFormat::contiguous);
  EXPECT_EQ(to_string(MemoryFormat::automatic), "auto");
  EXPECT_EQ(error_of([&] { names.parse("nhwc", "model.memory_format"); }),
            "model.memory_format: 'nhwc' is not one of auto | channels_last | contiguous");
}

}  // namespace memory_format_test
