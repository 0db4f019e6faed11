// The micro-step path reads no tensor value on the host (base/host_reads.h).
//
// On a GPU each such read (item(), nonzero(), any op whose output shape depends
// on values) makes the host wait for the device; the engine promises at most
// the step's own metrics read per optimizer step. This machine has no GPU, so
// the reads are observed instead of timed: a RecordFunction callback counts the
// ATen ops that read values on the host, and the ones inside
// GRADACCUM_CPU_HOST_READ_SCOPE() (input checks and compaction that run only
// for CPU tensors, where reading is free) separately. What this cannot see: a
// device-to-host copy (.to(kCPU)) is an ordinary copy on a CPU-only machine.
#include "gradaccum/base/host_reads.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "gradaccum/core/trainer.h"
#include "gradaccum/data/classification_dataset.h"
#include "gradaccum/data/lm_dataset.h"
#include "gradaccum/dist/bucketed_grad_sync.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/chunked_cross_entropy.h"
#include "gradaccum/models/gpt2.h"
#include "gradaccum/models/networks.h"
#include "gradaccum/models/sequence_classifier.h"
#include "gradaccum/models/tasks.h"
#include "in_process_ranks.h"
#include "test_support.h"
#include "tiny_decoders.h"

namespace host_reads_test {

using namespace gradaccum;

// ATen ops that read tensor values on the host: scalar reads and the ops whose
// output shape depends on the values. Only the outermost one of a nest counts
// (masked_select may call nonzero, item calls _local_scalar_dense).
bool reads_on_host(const char* op) {
  static const char* const kOps[] = {"aten::_local_scalar_dense",
                                     "aten::item",
                                     "aten::is_nonzero",
                                     "aten::nonzero",
                                     "aten::masked_select",
                                     "aten::equal",
                                     "aten::_unique",
                                     "aten::_unique2",
                                     "aten::unique_dim",
                                     "aten::unique_consecutive",
                                     "aten::unique_dim_consecutive",
                                     "aten::repeat_interleave",
                                     "aten::allclose"};
  for (const char* name : kOps) {
    if (std::strcmp(op, name) == 0) return true;
  }
  return false;
}

// Counts host reads while alive, from every thread (the ranks of the
// data-parallel case run on threads of their own).
class HostReadCounter {
 public:
  HostReadCounter() {
    std::lock_guard<std::mutex> lock(mutex_);
    outside_ = inside_ = 0;
    ops_.clear();
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                        .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
  }
  ~HostReadCounter() { at::removeCallback(handle_); }
  HostReadCounter(const HostReadCounter&) = delete;
  HostReadCounter& operator=(const HostReadCounter&) = delete;

  // Reads that would stall an accelerator, and reads of CPU tensors inside the scope.
  int64_t outside() const { return outside_.load(); }
  int64_t inside() const { return inside_.load(); }
  // The ops counted in outside(), for the failure message.
  std::string outside_ops() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string s;
    for (const auto& op : ops_) s += (s.empty() ? "" : ", ") + op;
    return s.empty() ? "none" : s;
  }

 private:
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    const char* name = fn.name();
    if (std::strcmp(name, base::kCpuHostReadScope) == 0) {
      ++scope_depth_;
    } else if (reads_on_host(name) && read_depth_++ == 0) {
      if (scope_depth_ > 0) {
        ++inside_;
      } else {
        ++outside_;
        std::lock_guard<std::mutex> lock(mutex_);
        ops_.emplace_back(name);
      }
    }
    return nullptr;
  }
  static void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
    const char* name = fn.name();
    if (std::strcmp(name, base::kCpuHostReadScope) == 0) {
      --scope_depth_;
    } else if (reads_on_host(name)) {
      --read_depth_;
    }
  }

  static inline std::atomic<int64_t> outside_{0}, inside_{0};
  static inline std::mutex mutex_;
  static inline std::vector<std::string> ops_;
  static inline thread_local int scope_depth_ = 0;
  static inline thread_local int read_depth_ = 0;
  at::CallbackHandle handle_ = 0;
};

// Host reads outside the scope, per optimizer step, in on_step order.
struct ReadsPerStep : core::TrainingObserver {
  explicit ReadsPerStep(const HostReadCounter& counter) : counter_(counter) {}
  // Counts from here (after the trainer's construction, which runs once).
  void start() { seen_ = counter_.outside(); }
  void on_step(const core::StepRecord&) override {
    const int64_t now = counter_.outside();
    reads.push_back(now - seen_);
    seen_ = now;
  }
  std::vector<int64_t> reads;

 private:
  const HostReadCounter& counter_;
  int64_t seen_ = 0;
};

core::TrainerOptions options(int64_t micro_batch, int64_t steps, int64_t max_steps) {
  core::TrainerOptions o;
  o.per_device_train_batch_size = micro_batch;
  o.gradient_accumulation_steps = steps;
  o.max_steps = max_steps;
  o.optimizer.type = optim::OptimizerType::adamw;
  o.optimizer.learning_rate = 1e-3;
  o.lr_scheduler_type = optim::ScheduleType::cosine;
  o.warmup_steps = 1;
  o.max_grad_norm = 1.0;  // clipping on: the global norm must not be read per micro-step either
  return o;
}

// Documents of 2 .. 13 tokens (ids in [1, 64)): padded micro-batches of uneven token counts.
std::vector<std::vector<data::TokenId>> documents(int64_t count) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(77);
  std::vector<std::vector<data::TokenId>> docs;
  for (int64_t i = 0; i < count; ++i) {
    const auto ids = torch::randint(1, 64, {2 + (i * 5) % 12}, generator, torch::kLong);
    docs.emplace_back(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  }
  return docs;
}

data::CausalLmDataset lm_data() {
  data::LmDatasetOptions o;
  o.max_length = 16;
  o.pad_token_id = 0;
  return data::CausalLmDataset(documents(48), o);
}

struct TrainingReads {
  std::vector<int64_t> per_step;  // outside the scope, per optimizer step
  int64_t inside = 0;             // inside the scope, in the whole run
  std::string ops;                // the ops read outside the scope, for failure messages
};

// Trains and counts the host reads of run(), not those of the trainer's construction.
TrainingReads training_reads(core::Trainable& model, const core::Dataset& data, const core::TrainerOptions& o) {
  HostReadCounter counter;
  ReadsPerStep per_step(counter);
  core::Trainer trainer(o, model, data, nullptr, per_step);
  per_step.start();
  const int64_t inside_before = counter.inside();
  trainer.run();
  EXPECT_EQ(static_cast<int64_t>(per_step.reads.size()), o.max_steps);
  return {per_step.reads, counter.inside() - inside_before, counter.outside_ops()};
}

TEST(HostReads, TheCounterSeesReadsAndTheScope) {
  HostReadCounter counter;
  const auto t = torch::arange(5, torch::kLong);
  EXPECT_EQ(t.sum().item<int64_t>(), 10);
  EXPECT_EQ(t.gt(2).nonzero().size(0), 2);
  EXPECT_EQ(t.masked_select(t.gt(3)).numel(), 1);
  EXPECT_EQ(counter.outside(), 3) << counter.outside_ops();
  {
    GRADACCUM_CPU_HOST_READ_SCOPE();
    EXPECT_TRUE(t.max().item<int64_t>() == 4);
  }
  EXPECT_EQ(counter.outside(), 3);
  EXPECT_EQ(counter.inside(), 1);
}

// The causal-LM loss off the CPU (masked) never reads; on the CPU (compact)
// its reads are inside the scope.
TEST(HostReads, ChunkedLossMaskedReadsNothingAndCompactOnlyInsideTheScope) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(3);
  auto hidden = torch::randn({3, 9, 8}, generator, torch::kFloat).requires_grad_(true);
  auto weight = torch::randn({37, 8}, generator, torch::kFloat).requires_grad_(true);
  auto labels = torch::randint(0, 37, {3, 9}, generator, torch::kLong);
  labels[0].slice(0, 6, 9).fill_(core::kIgnoreIndex);
  for (auto selection : {models::TargetSelection::masked, models::TargetSelection::compact}) {
    const bool masked = selection == models::TargetSelection::masked;
    SCOPED_TRACE(masked ? "masked" : "compact");
    HostReadCounter counter;
    auto loss = models::chunked_causal_lm_loss(hidden, weight, labels, 4, selection);
    loss.sum.backward();
    EXPECT_EQ(counter.outside(), 0) << counter.outside_ops();
    // compact: nonzero, and the label check's any().item().
    EXPECT_EQ(counter.inside(), masked ? 0 : 2);
  }
}

// Padded language modelling with the fused loss, clipping and AdamW, 3 micro-steps per window:
// nothing is read on the host on any micro-step, nor by the step (its metrics leave by one
// copy). The reads inside the scope are the CPU-only id check and loss compaction.
TEST(HostReads, Gpt2TrainingReadsNothingOnTheHostOnAnyMicroStep) {
  const auto data = lm_data();
  models::CausalLm model{models::Gpt2LmHeadModel(gradaccum::testing::tiny_gpt2_config())};
  const auto r = training_reads(model, data, options(4, 3, 3));
  EXPECT_EQ(r.per_step, (std::vector<int64_t>{0, 0, 0})) << r.ops;
  // Per micro-step: the id check (2 reads: min, max) and the compaction (nonzero, label check).
  // Per optimizer step: libtorch's fused AdamW reads each parameter's CPU step count, and the
  // gradient and weight norms each look for float32 squares out of range (optim/grad_clip.cpp).
  const auto tensors = static_cast<int64_t>(model.module().parameters().size());
  EXPECT_EQ(r.inside, 3 * 3 * 4 + 3 * (tensors + 2));
}

// The same with the memory savers and bf16 autocast on: activation checkpointing recomputes
// each block in the backward (autocast and RNG state restored), all without a host read.
TEST(HostReads, CheckpointedBf16Gpt2TrainingReadsNothingOnTheHostOnAnyMicroStep) {
  const auto data = lm_data();
  models::CausalLm model{models::Gpt2LmHeadModel(gradaccum::testing::tiny_gpt2_config())};
  auto* lm = dynamic_cast<models::CausalLmHeadImpl*>(&model.module());
  ASSERT_NE(lm, nullptr);
  lm->transformer->set_gradient_checkpointing(true);
  auto o = options(4, 3, 2);
  o.mixed_precision = core::MixedPrecision::bf16;
  const auto r = training_reads(model, data, o);
  EXPECT_EQ(r.per_step, (std::vector<int64_t>{0, 0})) << r.ops;
  // Inside the scope, per micro-step: the id check and the loss compaction (2 reads each); the
  // blocks' recompute repeats neither. Per optimizer step: the fused AdamW's step counts and
  // the two norms' range checks.
  const auto tensors = static_cast<int64_t>(model.module().parameters().size());
  EXPECT_EQ(r.inside, 2 * 3 * 4 + 2 * (tensors + 2));
}

// Gradient flow at every step (core/grad_flow.h) rides in the step's one transfer: it reads
// nothing on the host of its own.
TEST(HostReads, GradFlowEveryStepReadsNothingOnTheHost) {
  const auto data = lm_data();
  models::CausalLm model{models::Gpt2LmHeadModel(gradaccum::testing::tiny_gpt2_config())};
  auto o = options(4, 3, 3);
  o.grad_flow_steps = 1;
  const auto r = training_reads(model, data, o);
  EXPECT_EQ(r.per_step, (std::vector<int64_t>{0, 0, 0})) << r.ops;
}

// nan_policy: skip decides before stepping whether the window's loss is finite:
// exactly one read per optimizer step, whatever N.
TEST(HostReads, NanPolicySkipReadsOncePerOptimizerStep) {
  const auto data = lm_data();
  models::CausalLm model{models::Gpt2LmHeadModel(gradaccum::testing::tiny_gpt2_config())};
  auto o = options(2, 5, 3);
  o.nan_policy = core::NanPolicy::skip;
  const auto r = training_reads(model, data, o);
  EXPECT_EQ(r.per_step, (std::vector<int64_t>{1, 1, 1})) << r.ops;
}

// Sequence classification (BLOOM backbone, last-token pooling of padded rows).
TEST(HostReads, ClassifierTrainingReadsNothingOnTheHostOnAnyMicroStep) {
  std::vector<data::LabelledTokens> examples;
  for (const auto& doc : documents(40)) {
    examples.push_back({doc, static_cast<int64_t>(doc.size() % 3)});
  }
  data::ClassificationDatasetOptions d;
  d.max_length = 16;
  d.pad_token_id = 0;
  d.num_labels = 3;
  data::SequenceClassificationDataset data(examples, d);
  models::SequenceClassifier model{models::SequenceClassificationModel(
      models::as_decoder(models::BloomModel(gradaccum::testing::tiny_bloom_config())), 3, 0.02, 5)};
  const auto r = training_reads(model, data, options(2, 4, 2));
  EXPECT_EQ(r.per_step, (std::vector<int64_t>{0, 0})) << r.ops;
}

// The CNN with BatchNorm in training mode (running statistics updated every micro-step).
TEST(HostReads, BatchNormCnnTrainingReadsNothingOnTheHost) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(9);
  gradaccum::testing::TensorDataset data(torch::randn({32, 1, 28, 28}, generator, torch::kFloat),
                                         torch::randint(0, 10, {32}, generator, torch::kLong));
  models::Classifier model(models::small_cnn({4, 8}, 16, 10, models::NormKind::batch, 2));
  const auto r = training_reads(model, data, options(4, 4, 2));
  EXPECT_EQ(r.per_step, (std::vector<int64_t>{0, 0})) << r.ops;
}

// fp16's loss scaler checks the unscaled gradients for inf/nan once per window.
TEST(HostReads, Fp16ScalerReadsOncePerOptimizerStep) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  gradaccum::testing::TensorDataset data(torch::randn({32, 4}, generator, torch::kFloat),
                                         torch::randn({32, 1}, generator, torch::kFloat));
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::GELU(), torch::nn::Linear(8, 1));
  models::Regressor model(net);
  auto o = options(4, 4, 2);
  o.mixed_precision = core::MixedPrecision::fp16;
  const auto r = training_reads(model, data, o);
  EXPECT_EQ(r.per_step, (std::vector<int64_t>{1, 1})) << r.ops;
}

// Two data-parallel ranks: the bucketed reducer's hooks, the deferred all-reduce and the
// all-reduced totals read nothing on the host either.
TEST(HostReads, DataParallelGpt2ReadsNothingOnTheHostOnAnyMicroStep) {
  const auto data = lm_data();
  std::vector<std::vector<int64_t>> reads(2);
  HostReadCounter counter;
  gradaccum::testing::run_on_ranks(2, [&](const auto& group, int rank) {
    models::CausalLm model{models::Gpt2LmHeadModel(gradaccum::testing::tiny_gpt2_config())};
    std::vector<torch::Tensor> params = model.module().parameters();
    dist::GradSyncOptions sync_options;
    sync_options.bucket_bytes = 16 * 1024;  // several buckets
    dist::BucketedGradSync sync(group, params, sync_options);
    struct Steps : core::TrainingObserver {
      void on_step(const core::StepRecord& r) override { calls.push_back(r.allreduce_calls); }
      std::vector<int64_t> calls;
    } steps;
    core::Trainer trainer(options(2, 3, 2), model, data, nullptr, steps, &sync);
    trainer.run();
    EXPECT_EQ(steps.calls.size(), 2u);
    EXPECT_GT(steps.calls.at(0), 1);  // several buckets: the test covers the overlapped path
  });
  EXPECT_EQ(counter.outside(), 0) << counter.outside_ops();
  EXPECT_GT(counter.inside(), 0);
}

}  // namespace host_reads_test
