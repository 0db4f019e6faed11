// The accumulation loop against closed forms (in the style of ggml's
// test_gradient_accumulation), the remainder window, the "parameters change only
// at the last micro-step" check of seed 003, and decomposition invariance.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <type_traits>

#include "gradaccum/core/saved_geometry.h"
#include "gradaccum/core/trainer.h"
#include "gradaccum/models/networks.h"
#include "gradaccum/models/tasks.h"
#include "test_support.h"

namespace accumulation_test {

using namespace gradaccum;
using gradaccum::testing::TensorDataset;

// Wraps a model and records, at every micro-step's forward, the parameters and
// the gradients accumulated so far (i.e. the state after the previous micro-step).
class Recorder final : public core::Trainable {
 public:
  explicit Recorder(core::Trainable& inner) : inner_(inner) {}
  core::LossSum loss(const core::Batch& batch) override {
    params.push_back(gradaccum::testing::flat_params(inner_.module()).clone());
    grads.push_back(gradaccum::testing::flat_grads(inner_.module()).clone());
    batches.push_back(batch);
    return inner_.loss(batch);
  }
  core::EvalSums evaluate(const core::Batch& batch) override { return inner_.evaluate(batch); }
  torch::nn::Module& module() override { return inner_.module(); }

  std::vector<torch::Tensor> params, grads;
  std::vector<core::Batch> batches;

 private:
  core::Trainable& inner_;
};

class Collect final : public core::TrainingObserver {
 public:
  void on_step(const core::StepRecord& r) override { steps.push_back(r); }
  std::vector<core::StepRecord> steps;
};

// y = w·x with one weight: loss_i = (w x_i − t_i)², dloss_i/dw = 2 x_i (w x_i − t_i).
models::Regressor one_weight_model(double w0) {
  torch::nn::Sequential net(torch::nn::Linear(torch::nn::LinearOptions(1, 1).bias(false)));
  torch::NoGradGuard no_grad;
  net->parameters()[0].fill_(w0);
  return models::Regressor(net);
}

core::TrainerOptions sgd_options(int64_t b, int64_t n, double lr) {
  core::TrainerOptions o;
  o.per_device_train_batch_size = b;
  o.gradient_accumulation_steps = n;
  o.num_train_epochs = 1;  // one pass over the data unless a test says otherwise
  o.optimizer.type = optim::OptimizerType::sgd;
  o.optimizer.learning_rate = lr;
  o.lr_scheduler_type = optim::ScheduleType::constant;
  o.max_grad_norm = 0.0;
  o.dtype = torch::kDouble;
  o.per_device_eval_batch_size = 64;
  return o;
}

struct ClosedFormCase {
  int64_t micro_batch, steps;
  core::LossNormalization mode;
};

void PrintTo(const ClosedFormCase& c, std::ostream* os) { *os << "b=" << c.micro_batch << " N=" << c.steps; }

class ClosedForm : public ::testing::TestWithParam<ClosedFormCase> {};

TEST_P(ClosedForm, GradientsWeightsAndLossesAfterEveryMicroStepAndStep) {
  const auto c = GetParam();
  const int64_t n = 8;
  auto x = torch::arange(1, n + 1, torch::kDouble).mul(0.1).unsqueeze(1);
  auto t = torch::arange(1, n + 1, torch::kDouble).mul(0.3).unsqueeze(1) + 0.05;
  TensorDataset data(x, t);
  auto inner = one_weight_model(0.5);
  Recorder model(inner);
  auto options = sgd_options(c.micro_batch, c.steps, 0.05);
  options.loss_normalization = c.mode;
  options.num_train_epochs = 2;  // 4 samples per window: 2 windows per epoch, 4 steps
  Collect collect;
  core::Trainer trainer(options, model, data, nullptr, collect);
  trainer.run();
  ASSERT_EQ(collect.steps.size(), 4u);
  ASSERT_EQ(model.batches.size(), 4u * c.steps);

  const bool mean = c.mode == core::LossNormalization::window;
  double w = 0.5;
  size_t micro = 0;
  for (size_t step = 0; step < 4; ++step) {
    double grad_sum = 0.0, loss_sum = 0.0;
    int64_t count = 0;
    for (int64_t s = 0; s < c.steps; ++s, ++micro) {
      // State seen at this micro-step's forward: w unchanged, grad = Σ so far.
      EXPECT_NEAR(model.params[micro].item<double>(), w, 1e-14) << "micro " << micro;
      EXPECT_NEAR(model.grads[micro].item<double>(), grad_sum, 1e-13) << "micro " << micro;
      const auto& b = model.batches[micro];
      for (int64_t i = 0; i < b.samples; ++i) {
        const double xi = b.input[i][0].item<double>(), ti = b.target[i][0].item<double>();
        grad_sum += 2 * xi * (w * xi - ti);
        loss_sum += (w * xi - ti) * (w * xi - ti);
        ++count;
      }
    }
    const double g = mean ? grad_sum / count : grad_sum;
    const auto& r = collect.steps[step];
    EXPECT_EQ(r.items, 4);
    EXPECT_EQ(r.micro_steps, c.steps);
    EXPECT_NEAR(r.loss, mean ? loss_sum / count : loss_sum, 1e-13);
    EXPECT_NEAR(r.grad_norm, std::abs(g), 1e-13);
    EXPECT_DOUBLE_EQ(r.lr, 0.05);
    w -= 0.05 * g;
    EXPECT_NEAR(r.weight_norm, std::abs(w), 1e-14);
  }
  EXPECT_NEAR(inner.module().parameters()[0].item<double>(), w, 1e-14);
}

INSTANTIATE_TEST_SUITE_P(MeanAndSum, ClosedForm,
                         ::testing::Values(ClosedFormCase{1, 4, core::LossNormalization::window},
                                           ClosedFormCase{2, 2, core::LossNormalization::window},
                                           ClosedFormCase{1, 4, core::LossNormalization::sum},
                                           ClosedFormCase{2, 2, core::LossNormalization::sum}),
                         [](const auto& info) {
                           return std::string(info.param.mode == core::LossNormalization::window ? "Mean" : "Sum") +
                                  "_b" + std::to_string(info.param.micro_batch) + "xN" +
                                  std::to_string(info.param.steps);
                         });

TEST(Remainder, PartialLastWindowIsNormalizedByItsOwnCount) {
  auto x = torch::arange(1, 11, torch::kDouble).mul(0.1).unsqueeze(1);
  auto t = torch::arange(1, 11, torch::kDouble).mul(0.2).unsqueeze(1);
  TensorDataset data(x, t);
  auto inner = one_weight_model(0.0);
  Recorder model(inner);
  auto options = sgd_options(2, 4, 0.1);
  options.num_train_epochs = 3;
  Collect collect;
  core::Trainer trainer(options, model, data, nullptr, collect);
  EXPECT_EQ(trainer.plan().windows_per_epoch(), 2);
  EXPECT_EQ(trainer.total_steps(), 6);
  trainer.run();
  ASSERT_EQ(collect.steps.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const bool partial = i % 2 == 1;
    EXPECT_EQ(collect.steps[i].samples, partial ? 2 : 8);
    EXPECT_EQ(collect.steps[i].items, partial ? 2 : 8);
    EXPECT_EQ(collect.steps[i].micro_steps, partial ? 1 : 4);
    EXPECT_EQ(collect.steps[i].epoch, static_cast<int64_t>(i / 2));
  }
  // The partial window's loss and step use the mean over its own 2 samples.
  const auto& last = model.batches.back();
  ASSERT_EQ(last.samples, 2);
  const double w = model.params.back().item<double>();
  double loss = 0.0, grad = 0.0;
  for (int i = 0; i < 2; ++i) {
    const double xi = last.input[i][0].item<double>(), ti = last.target[i][0].item<double>();
    loss += (w * xi - ti) * (w * xi - ti) / 2;
    grad += 2 * xi * (w * xi - ti) / 2;
  }
  EXPECT_NEAR(collect.steps.back().loss, loss, 1e-13);
  EXPECT_NEAR(collect.steps.back().grad_norm, std::abs(grad), 1e-13);
  EXPECT_NEAR(inner.module().parameters()[0].item<double>(), w - 0.1 * grad, 1e-14);

  // last_window: drop keeps one window of 8 per epoch.
  auto dropped_inner = one_weight_model(0.0);
  options.last_window = core::LastWindow::drop;
  Collect dropped;
  core::Trainer drop_trainer(options, dropped_inner, data, nullptr, dropped);
  EXPECT_EQ(drop_trainer.plan().windows_per_epoch(), 1);
  EXPECT_EQ(drop_trainer.total_steps(), 3);
  drop_trainer.run();
  ASSERT_EQ(dropped.steps.size(), 3u);
  for (const auto& r : dropped.steps) EXPECT_EQ(r.samples, 8);
}

TEST(Seed003, ParametersChangeOnlyAtTheLastMicroStep) {
  torch::manual_seed(3);
  TensorDataset data(torch::randn({48, 16}), torch::randn({48, 1}));
  models::Regressor inner(models::seed000_mlp());
  Recorder model(inner);
  auto options = sgd_options(4, 4, 0.0);
  options.optimizer.type = optim::OptimizerType::adamw;
  options.optimizer.learning_rate = 1e-2;
  Collect collect;
  core::Trainer trainer(options, model, data, nullptr, collect);
  trainer.run();
  ASSERT_EQ(model.params.size(), 12u);  // 3 windows × 4 micro-steps
  for (size_t i = 1; i < model.params.size(); ++i) {
    const bool first_of_window = i % 4 == 0;
    const bool same = torch::equal(model.params[i], model.params[i - 1]);
    EXPECT_EQ(same, !first_of_window) << "micro-step " << i;
    // Gradients grow within a window and start from nothing in the next.
    EXPECT_EQ(model.grads[i].abs().sum().item<double>() == 0.0, first_of_window) << "micro-step " << i;
  }
}

// A weak reference to a tensor's grad_fn(): libtorch returns it as std::shared_ptr up to
// 2.11 and as c10::intrusive_ptr in later releases.
template <class P>
struct WeakOf;
template <class T>
struct WeakOf<std::shared_ptr<T>> {
  using type = std::weak_ptr<T>;
};
template <class T>
struct WeakOf<c10::intrusive_ptr<T>> {
  using type = c10::weak_intrusive_ptr<T>;
};
using WeakNode = WeakOf<std::decay_t<decltype(std::declval<const torch::Tensor&>().grad_fn())>>::type;

// Records, at every micro-step, whether the previous micro-step's autograd
// graph is still alive (through a weak reference to its root node).
class GraphWatcher final : public core::Trainable {
 public:
  explicit GraphWatcher(core::Trainable& inner) : inner_(inner) {}
  core::LossSum loss(const core::Batch& batch) override {
    previous_alive.push_back(previous_root_.has_value() && !previous_root_->expired());
    auto micro = inner_.loss(batch);
    if (micro.sum.grad_fn()) ++roots_seen;
    previous_root_.emplace(micro.sum.grad_fn());
    return micro;
  }
  core::EvalSums evaluate(const core::Batch& batch) override { return inner_.evaluate(batch); }
  torch::nn::Module& module() override { return inner_.module(); }

  std::vector<bool> previous_alive;
  int roots_seen = 0;

 private:
  core::Trainable& inner_;
  std::optional<WeakNode> previous_root_;
};

// Nothing in the trainer keeps a micro-step's graph past its backward: holding
// the loss sums as graph roots once kept tensors alive to the window's end
// (+96 MB peak RSS on a 3.4M GPT).
TEST(GraphLifetime, EachMicroStepsGraphIsFreedBeforeTheNextMicroStep) {
  torch::manual_seed(4);
  TensorDataset data(torch::randn({48, 16}), torch::randn({48, 1}));
  models::Regressor inner(models::seed000_mlp());
  GraphWatcher model(inner);
  Collect collect;
  core::Trainer trainer(sgd_options(4, 4, 0.1), model, data, nullptr, collect);
  trainer.run();
  ASSERT_EQ(model.previous_alive.size(), 12u);  // 3 windows × 4 micro-steps
  EXPECT_EQ(model.roots_seen, 12);              // every micro-step had a graph to watch
  for (size_t i = 0; i < model.previous_alive.size(); ++i) {
    EXPECT_FALSE(model.previous_alive[i]) << "micro-step " << i;
  }
}

using gradaccum::testing::Trajectory;

// 60 samples, 12 steps of seed 000's MLP (test_support.h).
Trajectory train_mlp(int64_t b, int64_t n, int64_t samples, int64_t steps) {
  return gradaccum::testing::train_seed000_mlp(b, n, samples, steps);
}

TEST(Decomposition, SameTrajectoryForEverySplitOfTheGlobalBatch) {
  // 60 samples, B = 8: 7 full windows and a partial one of 4 per epoch; 12 steps
  // cross the epoch boundary and the partial window.
  const auto reference = train_mlp(8, 1, 60, 12);
  ASSERT_EQ(reference.loss.size(), 12u);
  for (auto [b, n] : std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {2, 4}, {1, 8}}) {
    const auto other = train_mlp(b, n, 60, 12);
    for (size_t i = 0; i < reference.loss.size(); ++i) {
      EXPECT_NEAR(other.loss[i], reference.loss[i], 1e-10 * std::abs(reference.loss[i]))
          << b << "x" << n << " step " << i;
      EXPECT_NEAR(other.grad_norm[i], reference.grad_norm[i], 1e-10 * reference.grad_norm[i])
          << b << "x" << n << " step " << i;
    }
    EXPECT_LE(gradaccum::testing::max_relative_difference(other.weights, reference.weights), 1e-10);
  }
  // A different global batch gives a different trajectory: the check can fail.
  const auto different = train_mlp(4, 1, 60, 12);
  EXPECT_GT(std::abs(different.loss[1] - reference.loss[1]), 1e-6);
}

// A resumed run's summary: its totals include the checkpoint's samples, its rates only what this
// run trained (the checkpoint's samples took no time here).
TEST(TrainSummaryRates, CountOnlyTheSamplesThisRunTrained) {
  torch::manual_seed(0);
  TensorDataset data(torch::randn({32, 16}, torch::kDouble), torch::randn({32, 1}, torch::kDouble));
  models::Regressor model(models::seed000_mlp());
  core::TrainingObserver quiet;
  core::Trainer trainer(gradaccum::testing::seed000_options(4, 2, 4), model, data, nullptr, quiet);
  core::TrainingState state;
  state.position.step = state.position.schedule_step = 2;
  state.position.window = 2;
  state.position.samples = state.position.items = 1'000'000'000;  // as if the first run were long
  core::SavedGeometry{core::BatchGeometry::from_accumulation(4, 2, 1), 0}.save(state);
  trainer.restore(state);
  const auto summary = trainer.run();
  EXPECT_EQ(summary.steps, 4);
  EXPECT_EQ(summary.samples, 1'000'000'000 + 16);
  EXPECT_NEAR(summary.samples_per_s * summary.wall_s, 16.0, 1e-9);
  EXPECT_NEAR(summary.items_per_s * summary.wall_s, 16.0, 1e-9);
}

}  // namespace accumulation_test
