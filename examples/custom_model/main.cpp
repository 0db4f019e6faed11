// Training one's own libtorch module with exact gradient accumulation: a small regression
// network on synthetic points, micro-batches of 8 and a global batch of 32 (4 micro-steps on one
// process, 2 on each of two), through gradaccum::run::fit.
//   custom_model OUTPUT_DIR [--nproc N]
#include <gradaccum/base/check.h>
#include <gradaccum/run/fit.h>
#include <gradaccum/run/launcher.h>

#include <cstdio>
#include <string>

namespace ga = gradaccum;

struct NetImpl : torch::nn::Module {
  NetImpl()
      : hidden(register_module("hidden", torch::nn::Linear(8, 32))),
        out(register_module("out", torch::nn::Linear(32, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return out(torch::tanh(hidden(x))); }
  torch::nn::Linear hidden, out;
};
TORCH_MODULE(Net);

// The loss as a sum and the count behind it: the engine divides once per window, so every split
// of the global batch gives the full batch's gradient.
struct SquaredError : ga::core::Trainable {
  ga::core::LossSum loss(const ga::core::Batch& batch) override {
    auto sum = (net->forward(batch.input) - batch.target).pow(2).sum();
    return {sum, torch::scalar_tensor(batch.target.numel(), torch::kLong)};
  }
  ga::core::EvalSums evaluate(const ga::core::Batch& batch) override {
    auto l = loss(batch);
    return {l.sum, l.count, torch::Tensor()};
  }
  torch::nn::Module& module() override { return *net; }
  Net net;
};

// y = sin(0.3 Σ x) + noise for 1000 points x in R^8, drawn once from a fixed seed.
struct Points : ga::core::Dataset {
  Points()
      : x(torch::randn({1000, 8}, torch::kDouble)),
        y(torch::sin(0.3 * x.sum(1, true)) + 0.05 * torch::randn({1000, 1}, torch::kDouble)) {}
  int64_t size() const override { return x.size(0); }
  ga::core::Batch get(const torch::Tensor& indices, torch::ScalarType dtype) const override {
    ga::core::Batch batch;
    batch.input = x.index_select(0, indices).to(dtype);
    batch.target = y.index_select(0, indices).to(dtype);
    batch.samples = indices.size(0);
    return batch;
  }
  torch::Tensor x, y;
};

int main(int argc, char** argv) try {
  GA_CHECK(argc == 2 || (argc == 4 && std::string(argv[2]) == "--nproc"), "usage: custom_model OUTPUT_DIR [--nproc N]");
  if (argc == 4) return ga::run::launch_local(std::stoll(argv[3]), {argv[1]});  // N ranks of this program
  torch::manual_seed(0);  // the same data and initial weights on every rank
  Points data;
  SquaredError model;
  ga::run::RunOptions options;
  options.output_dir = argv[1];
  options.threads = 1;
  options.trainer.per_device_train_batch_size = 8;
  options.trainer.global_batch_size = 32;  // N = 32 / (8 × ranks)
  options.trainer.max_steps = 20;
  options.trainer.dtype = torch::kDouble;
  options.trainer.optimizer.learning_rate = 3e-2;
  options.trainer.eval_steps = 0;
  const auto result = ga::run::fit(options, model, data);
  if (result.rank == 0)
    std::printf("trained %lld steps, last loss %.6f\n", static_cast<long long>(result.summary.steps),
                result.summary.final_loss);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "custom_model: error: %s\n", e.what());
  return 1;
}
