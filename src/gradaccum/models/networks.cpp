#include "gradaccum/models/networks.h"

namespace gradaccum::models {

namespace nn = torch::nn;

GeluMlpImpl::GeluMlpImpl(int64_t in_features, int64_t hidden_features, int64_t out_features) {
  // Names "0" and "2" as in the Sequential (with the GELU at "1"), so state
  // dicts and golden files keyed by parameter name fit either form.
  fc1 = register_module("0", nn::Linear(in_features, hidden_features));
  fc2 = register_module("2", nn::Linear(hidden_features, out_features));
}

bool GeluMlpImpl::fuses(const torch::Tensor& x) const {
  return kernels::gelu_mlp_fuses(x, fc1->weight, fc1->bias, fc2->weight, fc2->bias);
}

torch::Tensor GeluMlpImpl::forward(const torch::Tensor& x) {
  return kernels::gelu_mlp(x, fc1->weight, fc1->bias, fc2->weight, fc2->bias);
}

GeluMlp seed000_mlp() { return GeluMlp(16, 32, 1); }

nn::Sequential seed000_sequential_mlp(bool batch_norm) {
  nn::Sequential net;
  net->push_back("0", nn::Linear(16, 32));
  if (batch_norm) {
    net->push_back("1", nn::BatchNorm1d(32));
  } else {
    net->push_back("1", nn::GELU());
  }
  net->push_back("2", nn::Linear(32, 1));
  return net;
}

nn::Sequential image_mlp(int64_t in_features, const std::vector<int64_t>& hidden, int64_t classes, NormKind norm,
                         int64_t groups) {
  nn::Sequential net;
  net->push_back("flatten", nn::Flatten());
  int64_t width = in_features;
  for (size_t i = 0; i < hidden.size(); ++i) {
    net->push_back(fmt::format("fc{}", i), nn::Linear(width, hidden[i]));
    if (norm != NormKind::none) {
      net->push_back(fmt::format("norm{}", i), make_norm1d(norm, hidden[i], groups));
    }
    net->push_back(fmt::format("relu{}", i), nn::ReLU());
    width = hidden[i];
  }
  net->push_back("head", nn::Linear(width, classes));
  return net;
}

nn::Sequential small_cnn(const std::vector<int64_t>& channels, int64_t hidden, int64_t classes, NormKind norm,
                         int64_t groups, double dropout, DropoutRng dropout_rng, MemoryFormat format) {
  nn::Sequential net;
  if (format != MemoryFormat::contiguous) net->push_back("memory_format", MemoryFormatLayer(format));
  int64_t in = 1;
  int64_t side = 28;
  for (size_t i = 0; i < channels.size(); ++i) {
    // A conv followed by a norm needs no bias: the norm's shift replaces it.
    net->push_back(fmt::format("conv{}", i),
                   nn::Conv2d(nn::Conv2dOptions(in, channels[i], 3).padding(1).bias(norm == NormKind::none)));
    if (norm != NormKind::none) {
      net->push_back(fmt::format("norm{}", i), make_norm2d(norm, channels[i], groups));
    }
    net->push_back(fmt::format("relu{}", i), nn::ReLU());
    net->push_back(fmt::format("pool{}", i), nn::MaxPool2d(nn::MaxPool2dOptions(2)));
    in = channels[i];
    side /= 2;
  }
  net->push_back("flatten", nn::Flatten());
  net->push_back("fc", nn::Linear(in * side * side, hidden));
  net->push_back("relu_fc", nn::ReLU());
  if (dropout > 0.0) net->push_back("drop_fc", SampleDropout(dropout, 0, dropout_rng));
  net->push_back("head", nn::Linear(hidden, classes));
  return net;
}

namespace {
// conv → norm → ReLU → conv → norm, plus a (projected) shortcut, then ReLU.
class BasicBlockImpl : public nn::Module {
 public:
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride, NormKind norm, int64_t groups) {
    const bool bias = norm == NormKind::none;
    conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(bias)));
    norm1_ = nn::AnyModule(make_norm2d(norm, out, groups));
    register_module("norm1", norm1_.ptr());
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(bias)));
    norm2_ = nn::AnyModule(make_norm2d(norm, out, groups));
    register_module("norm2", norm2_.ptr());
    if (stride != 1 || in != out) {
      shortcut_ = register_module("shortcut", nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(norm1_.forward(conv1_->forward(x)));
    y = norm2_.forward(conv2_->forward(y));
    return torch::relu(y + (shortcut_ ? shortcut_->forward(x) : x));
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, shortcut_{nullptr};
  nn::AnyModule norm1_, norm2_;
};
TORCH_MODULE(BasicBlock);
}  // namespace

nn::Sequential small_resnet(const std::vector<int64_t>& channels, int64_t classes, NormKind norm, int64_t groups,
                            MemoryFormat format) {
  nn::Sequential net;
  if (format != MemoryFormat::contiguous) net->push_back("memory_format", MemoryFormatLayer(format));
  const int64_t stem = channels.empty() ? 16 : channels.front();
  net->push_back("stem", nn::Conv2d(nn::Conv2dOptions(1, stem, 3).padding(1).bias(norm == NormKind::none)));
  net->push_back("stem_norm", make_norm2d(norm, stem, groups));
  net->push_back("stem_relu", nn::ReLU());
  int64_t in = stem;
  for (size_t i = 0; i < channels.size(); ++i) {
    net->push_back(fmt::format("block{}", i), BasicBlock(in, channels[i], i == 0 ? 1 : 2, norm, groups));
    in = channels[i];
  }
  net->push_back("pool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)));
  net->push_back("flatten", nn::Flatten());
  net->push_back("head", nn::Linear(in, classes));
  return net;
}

}  // namespace gradaccum::models
