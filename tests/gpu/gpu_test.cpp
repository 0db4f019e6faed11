// The CUDA path: training on a CUDA device follows the CPU's and the full batch's trajectory
// (float64), the masked LM loss gives the CPU's sums and gradients, batches reach the device
// through pinned memory, and two NCCL ranks equal one process. Every test skips, naming the
// reason, where no CUDA device is visible or the build links libtorch's CPU libraries only
// (configure with -DGRADACCUM_WITH_CUDA=ON). CI compiles this file in both builds.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#ifdef GRADACCUM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "gradaccum/core/grad_flow.h"
#include "gradaccum/core/trainer.h"
#include "gradaccum/dist/process_group.h"
#include "gradaccum/models/built_model.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/gpt2.h"
#include "gradaccum/models/networks.h"
#include "gradaccum/models/sample_dropout.h"
#include "gradaccum/models/tasks.h"
#include "padded_batches.h"
#include "test_support.h"
#include "tiny_decoders.h"

namespace {

using namespace gradaccum;

// "" when a CUDA device can run these tests, else why not.
std::string cuda_unavailable() {
#ifndef GRADACCUM_WITH_CUDA
  return "this build links libtorch's CPU libraries only (configure with -DGRADACCUM_WITH_CUDA=ON)";
#else
  if (!torch::cuda::is_available()) return "no CUDA device is visible";
  return "";
#endif
}

#define SKIP_WITHOUT_CUDA()                                        \
  do {                                                             \
    if (const auto reason = cuda_unavailable(); !reason.empty()) { \
      GTEST_SKIP() << reason;                                      \
    }                                                              \
  } while (false)

using gradaccum::testing::relative_difference;
using gradaccum::testing::Trajectory;

// Seed 000's MLP in float64 on `device`, b × n over 60 samples for 12 steps (crossing the
// epoch's partial window), as tests/core/accumulation_test.cpp trains it on the CPU.
Trajectory train_mlp(const torch::Device& device, int64_t b, int64_t n) {
  return gradaccum::testing::train_seed000_mlp(b, n, 60, 12, device);
}

void expect_same_trajectory(const Trajectory& a, const Trajectory& b, double tolerance, const std::string& what) {
  ASSERT_EQ(a.loss.size(), b.loss.size()) << what;
  for (size_t i = 0; i < a.loss.size(); ++i) {
    EXPECT_NEAR(a.loss[i], b.loss[i], tolerance * std::abs(b.loss[i])) << what << " step " << i;
    EXPECT_NEAR(a.grad_norm[i], b.grad_norm[i], tolerance * b.grad_norm[i]) << what << " step " << i;
  }
  EXPECT_LE(gradaccum::testing::max_relative_difference(a.weights, b.weights), tolerance) << what;
}

TEST(GpuTraining, DecompositionsOnCudaFollowTheFullBatchAndTheCpu) {
  SKIP_WITHOUT_CUDA();
  const auto full_batch = train_mlp(torch::kCUDA, 8, 1);
  ASSERT_EQ(full_batch.loss.size(), 12u);
  for (auto [b, n] : std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {1, 8}}) {
    expect_same_trajectory(train_mlp(torch::kCUDA, b, n), full_batch, 1e-10,
                           std::to_string(b) + "x" + std::to_string(n) + " on CUDA");
  }
  expect_same_trajectory(train_mlp(torch::kCPU, 2, 4), full_batch, 1e-10, "2x4 on the CPU");
}

// The fused LM-head loss with padding labelled -100, on CUDA against the CPU in float64: the
// same sum, the same count of targets, the same gradients.
TEST(GpuLmLoss, MaskedFusedLossOnCudaEqualsTheCpu) {
  SKIP_WITHOUT_CUDA();
  const auto data = gradaccum::testing::pad(gradaccum::testing::make_sequences({5, 9, 3, 12}, 7), false);
  const auto labels = data.ids.masked_fill(data.mask == 0, core::kIgnoreIndex);
  auto run = [&](const torch::Device& device) {
    models::CausalLm model{models::Gpt2LmHeadModel(gradaccum::testing::tiny_gpt2_config())};
    model.module().to(device, torch::kDouble);
    auto l = model.loss({data.ids.to(device), labels.to(device), data.mask.to(device), 4});
    l.sum.backward();
    return std::make_tuple(l.sum.item<double>(), l.count.item<double>(),
                           gradaccum::testing::flat_grads(model.module()).cpu());
  };
  const auto [cpu_sum, cpu_count, cpu_grads] = run(torch::kCPU);
  const auto [cuda_sum, cuda_count, cuda_grads] = run(torch::kCUDA);
  EXPECT_EQ(cuda_count, cpu_count);
  EXPECT_EQ(cpu_count, (5 - 1) + (9 - 1) + (3 - 1) + (12 - 1));
  EXPECT_NEAR(cuda_sum, cpu_sum, 1e-12 * std::abs(cpu_sum));
  EXPECT_LE(gradaccum::testing::max_relative_difference(cuda_grads, cpu_grads), 1e-10);
}

// A Llama-family decoder (RoPE, RMSNorm, SwiGLU, 2 key-value heads for 4 query heads) as a
// causal LM on a left-padded batch: on CUDA its loss, count and gradients equal the CPU's in
// float64; under bf16 autocast on CUDA it stays near float32 while really running in bf16.
struct LlamaStep {
  double sum = 0;
  double count = 0;
  torch::Tensor grads;  // flat, float64, on the CPU
};

LlamaStep llama_step(const torch::Device& device, torch::ScalarType dtype, bool bf16_autocast) {
  const auto data = gradaccum::testing::pad(gradaccum::testing::make_sequences({5, 9, 3, 12}, 7), /*left=*/true);
  const auto labels = data.ids.masked_fill(data.mask == 0, core::kIgnoreIndex);
  auto built = models::make_language_model("llama", gradaccum::testing::tiny_llama_config(),
                                           gradaccum::testing::tiny_gpt2_config().vocab_size,
                                           /*num_labels=*/0, /*init_seed=*/3);
  built.task->module().to(device, dtype);
  core::LossSum l;
  {
    at::autocast::set_autocast_enabled(device.type(), bf16_autocast);
    if (bf16_autocast) at::autocast::set_autocast_dtype(device.type(), torch::kBFloat16);
    l = built.task->loss({data.ids.to(device), labels.to(device), data.mask.to(device), 4});
    at::autocast::set_autocast_enabled(device.type(), false);
    at::autocast::clear_cache();
  }
  l.sum.backward();
  return {l.sum.item<double>(), l.count.item<double>(),
          gradaccum::testing::flat_grads(built.task->module()).to(torch::kCPU, torch::kDouble)};
}

TEST(GpuLlama, TrainingStepOnCudaEqualsTheCpuInFloat64AndBf16AutocastStaysNearFloat32) {
  SKIP_WITHOUT_CUDA();
  const auto cpu = llama_step(torch::kCPU, torch::kDouble, false);
  const auto cuda = llama_step(torch::kCUDA, torch::kDouble, false);
  EXPECT_EQ(cpu.count, (5 - 1) + (9 - 1) + (3 - 1) + (12 - 1));
  EXPECT_EQ(cuda.count, cpu.count);
  EXPECT_NEAR(cuda.sum, cpu.sum, 1e-12 * std::abs(cpu.sum));
  EXPECT_LE(gradaccum::testing::max_relative_difference(cuda.grads, cpu.grads), 1e-10);

  const auto fp32 = llama_step(torch::kCUDA, torch::kFloat, false);
  const auto bf16 = llama_step(torch::kCUDA, torch::kFloat, true);
  EXPECT_EQ(bf16.count, cpu.count);
  EXPECT_NEAR(fp32.sum, cpu.sum, 1e-5 * std::abs(cpu.sum));
  EXPECT_NEAR(bf16.sum, fp32.sum, 3e-2 * std::abs(fp32.sum));
  EXPECT_TRUE(torch::isfinite(bf16.grads).all().item<bool>());
  // bf16 really ran: its gradients differ from float32's well beyond float32's rounding.
  const double bf16_vs_fp32 = gradaccum::testing::max_relative_difference(bf16.grads, fp32.grads);
  std::printf("[ measured ] Llama bf16 autocast vs float32 gradients on CUDA: %.3e\n", bf16_vs_fp32);
  EXPECT_GT(bf16_vs_fp32, 1e-4);
  EXPECT_LT(bf16_vs_fp32, 0.5);
}

// On a GPU the fused loss's automatic chunk holds ~512 MiB of float32 logits (64 MiB on the
// CPU, tests/models/chunked_cross_entropy_test.cpp): longer chunks keep a GPU's matmuls busy.
TEST(GpuLmLoss, AutomaticChunkKeepsFloat32LogitsNear512MiB) {
  SKIP_WITHOUT_CUDA();
  auto config = gradaccum::testing::tiny_gpt2_config();
  config.vocab_size = 50257;
  models::CausalLm model{models::Gpt2LmHeadModel(config)};
  EXPECT_EQ(model.chunk_tokens(), 333);  // 64 MiB / (50257 × 4 B)
  model.module().to(torch::kCUDA);
  EXPECT_EQ(model.chunk_tokens(), 2670);  // 512 MiB / (50257 × 4 B)
}

// The trainer copies each batch to the device from page-locked memory (core/trainer.cpp): a
// pinned copy queued on the stream arrives intact.
TEST(GpuPinnedCopies, PinnedNonBlockingCopiesArriveIntact) {
  SKIP_WITHOUT_CUDA();
  const auto host = torch::arange(1 << 20, torch::kDouble).pin_memory();
  ASSERT_TRUE(host.is_pinned());
  const auto device = host.to(torch::kCUDA, /*non_blocking=*/true);
  EXPECT_TRUE(torch::equal(device.cpu(), host));
}

// Gradient-flow statistics (core/grad_flow.h) of CUDA gradients equal the CPU's: a gradient
// of 2^25 + 5 elements crosses the device's 2^24-element slices (three of them), a bf16 one
// reads exactly, and the counts are exact.
TEST(GpuGradFlow, StatisticsOnCudaEqualTheCpus) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(11);
  auto large = torch::zeros({(1 << 25) + 5}).requires_grad_();
  large.mutable_grad() = torch::randn({(1 << 25) + 5});
  large.mutable_grad().narrow(0, 1 << 24, 4096).zero_();
  auto half = torch::zeros({2, 2}, torch::kBFloat16).requires_grad_();
  half.mutable_grad() = torch::tensor({{0.5, 0.0}, {-2.0, 0.0}}).to(torch::kBFloat16);
  auto none = torch::zeros({3}).requires_grad_();
  std::vector<torch::Tensor> cuda;
  for (const auto& p : {large, half, none}) {
    auto q = p.detach().to(torch::kCUDA).requires_grad_();
    if (p.grad().defined()) q.mutable_grad() = p.grad().to(torch::kCUDA);
    cuda.push_back(q);
  }
  const auto on_cpu = core::grad_flow_statistics({large, half, none});
  const auto on_cuda = core::grad_flow_statistics(cuda);
  ASSERT_TRUE(on_cuda.is_cuda());
  const auto c = core::grad_flow_record(1, {"large", "half", "none"}, on_cpu);
  const auto g = core::grad_flow_record(1, {"large", "half", "none"}, on_cuda.cpu());
  const auto exact = large.grad().to(torch::kDouble).abs();
  EXPECT_LE(relative_difference(g.mean_abs[0], exact.mean().item<double>()), 1e-6);
  EXPECT_LE(relative_difference(g.mean_abs[0], c.mean_abs[0]), 1e-6);
  EXPECT_EQ(g.max_abs[0], c.max_abs[0]);
  EXPECT_EQ(g.zero_fraction[0], 4096.0 / ((1 << 25) + 5));
  EXPECT_EQ(g.mean_abs[1], 0.625);
  EXPECT_EQ(g.max_abs[1], 2.0);
  EXPECT_EQ(g.zero_fraction[1], 0.5);
  EXPECT_EQ(g.mean_abs[2], 0.0);
  EXPECT_EQ(g.zero_fraction[2], 1.0);
}

// NCCL with one rank, so one GPU suffices: the bucketed reducer's gradient views, its launches
// from backward's hooks and its waits, and the loss totals' all-reduce, all on CUDA tensors,
// leave one process's trajectory unchanged.
TEST(GpuNccl, OneRankGroupTrainsAsOneProcess) {
  SKIP_WITHOUT_CUDA();
#ifdef GRADACCUM_WITH_CUDA
  dist::DistEnvironment env;
  env.master_port = 29650;
  auto connection = dist::connect(env, std::chrono::seconds(60), c10::Device(torch::kCUDA, 0));
  EXPECT_EQ(connection.group->getBackendName(), "nccl");
  const auto alone = train_mlp(torch::kCUDA, 2, 4);
  const auto synced = gradaccum::testing::train_seed000_mlp(2, 4, 60, 12, torch::kCUDA, connection.group,
                                                            /*bucket_bytes=*/1024);
  expect_same_trajectory(synced, alone, 1e-12, "2x4 through a one-rank NCCL group");
  // 609 float64 parameters (4.9 kB) in buckets of 1 kB: several buckets, one all-reduce each
  // per window.
  EXPECT_GT(synced.buckets, 1);
  EXPECT_EQ(synced.allreduce_calls, synced.buckets);
  connection.group->shutdown();
#endif
}

// A tiny GPT-2 run of the program over 64 documents of 4 to 26 words (so micro-batches differ
// in padding), with GPT-2's BPE; the corpus is written into `dir`.
std::string tiny_gpt_run(const std::string& dir) {
  const std::string corpus = dir + "/documents.txt";
  std::ofstream out(corpus);
  for (int d = 0; d < 64; ++d) {
    out << "Document " << d << " says";
    for (int w = 0; w < 1 + (d * 7) % 23; ++w) out << " word" << (d * 31 + w * 17) % 97;
    out << ".\n";
  }
  return "--set model.type=gpt2 --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=4 "
         "--set model.n_positions=64 --set data.type=text --set data.path=" +
         corpus + " --set data.tokenizer=" + gradaccum::testing::gpt2_tokenizer_dir() +
         " --set data.max_length=40 --set data.eval_limit=-1 --set max_steps=3 --set threads=2 "
         "--set learning_rate=1e-2 --set seed=7";
}

// The program with device: cuda, on padded documents (the masked loss): in float64, 4 x 4 on
// CUDA gives the CPU's 16 x 1 step by step; under bf16 autocast on CUDA it stays within
// bfloat16's rounding of it.
// The per-sample dropout masks are the same bits on a GPU (int64 tensor arithmetic wraps there
// as on the CPU), and a dropout run on CUDA follows the CPU's in float64.
TEST(GpuDropout, PerSampleMasksOnCudaEqualTheCpusAndTrainingFollowsIt) {
  SKIP_WITHOUT_CUDA();
  const gradaccum::core::SampleKeys keys{torch::tensor({3, 17, 123456789}, torch::kLong), 5, 42};
  const auto x = torch::ones({3, 2, 40, 40});
  const auto cpu = gradaccum::models::per_sample_dropout_scale(x, 0.1, keys, 7);
  const auto cuda = gradaccum::models::per_sample_dropout_scale(x.cuda(), 0.1, keys, 7);
  EXPECT_TRUE(torch::equal(cuda.cpu(), cpu));
  const auto dir = gradaccum::testing::make_temp_dir("gpu-dropout");
  const std::string run = tiny_gpt_run(dir) +
                          " --set dtype=float64 --set model.resid_pdrop=0.1 "
                          "--set model.embd_pdrop=0.1 --set model.attn_pdrop=0.1";
  const auto on_cpu = gradaccum::testing::train_steps(
      run + " --set per_device_train_batch_size=16 --set gradient_accumulation_steps=1", dir + "/cpu");
  const auto on_cuda = gradaccum::testing::train_steps(
      run + " --set device=cuda --set per_device_train_batch_size=4 --set gradient_accumulation_steps=4",
      dir + "/cuda");
  ASSERT_EQ(on_cuda.size(), on_cpu.size());
  for (size_t i = 0; i < on_cpu.size(); ++i) {
    EXPECT_LE(relative_difference(on_cuda[i]["loss"].get<double>(), on_cpu[i]["loss"].get<double>()), 1e-10) << i;
    EXPECT_LE(relative_difference(on_cuda[i]["grad_norm"].get<double>(), on_cpu[i]["grad_norm"].get<double>()), 1e-10)
        << i;
  }
  std::filesystem::remove_all(dir);
}

TEST(GpuCli, GptOnPaddedDocumentsFollowsTheCpuFullBatch) {
  SKIP_WITHOUT_CUDA();
  const auto dir = gradaccum::testing::make_temp_dir("gpu-cli");
  const std::string run = tiny_gpt_run(dir);
  const auto cpu = gradaccum::testing::train_steps(
      run + " --set dtype=float64 --set per_device_train_batch_size=16 --set gradient_accumulation_steps=1",
      dir + "/cpu");
  const auto cuda =
      gradaccum::testing::train_steps(run +
                                          " --set dtype=float64 --set device=cuda --set per_device_train_batch_size=4 "
                                          "--set gradient_accumulation_steps=4",
                                      dir + "/cuda");
  const auto bf16 = gradaccum::testing::train_steps(
      run +
          " --set device=cuda --set mixed_precision=bf16 --set per_device_train_batch_size=4 "
          "--set gradient_accumulation_steps=4",
      dir + "/bf16");
  ASSERT_EQ(cpu.size(), 3u);
  ASSERT_EQ(cuda.size(), cpu.size());
  ASSERT_EQ(bf16.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double loss = cpu[i]["loss"].get<double>(), norm = cpu[i]["grad_norm"].get<double>();
    EXPECT_EQ(cuda[i]["items"], cpu[i]["items"]) << "step " << i + 1;
    EXPECT_EQ(bf16[i]["items"], cpu[i]["items"]) << "step " << i + 1;
    EXPECT_LE(relative_difference(cuda[i]["loss"].get<double>(), loss), 1e-10) << "step " << i + 1;
    EXPECT_LE(relative_difference(cuda[i]["grad_norm"].get<double>(), norm), 1e-10) << "step " << i + 1;
    // bfloat16 keeps 8 bits (2^-8 = 3.9e-3 per rounding); on an H200 the three steps stayed
    // within 1.4e-4 (loss) and 1.6e-3 (gradient norm) of float64.
    EXPECT_LE(relative_difference(bf16[i]["loss"].get<double>(), loss), 2e-3) << "step " << i + 1;
    EXPECT_LE(relative_difference(bf16[i]["grad_norm"].get<double>(), norm), 2e-2) << "step " << i + 1;
    std::cout << "step " << i + 1 << ": loss cpu " << loss << ", cuda f64 " << cuda[i]["loss"] << ", cuda bf16 "
              << bf16[i]["loss"] << "; grad norm cpu " << norm << ", cuda f64 " << cuda[i]["grad_norm"]
              << ", cuda bf16 " << bf16[i]["grad_norm"] << "\n";
  }
  std::filesystem::remove_all(dir);
}

// fp16 autocast with the dynamic loss scaler on CUDA and on the CPU (both real autocast since
// libtorch 2.x): the first step's scaled gradients overflow at the initial scale of 65536 on both,
// so both skip it and halve the scale; the steps after agree within float16's rounding.
TEST(GpuCli, Fp16SkipsAndScalesAsOnTheCpu) {
  SKIP_WITHOUT_CUDA();
  const auto dir = gradaccum::testing::make_temp_dir("gpu-cli-fp16");
  const std::string run = tiny_gpt_run(dir) +
                          " --set mixed_precision=fp16 --set per_device_train_batch_size=4 "
                          "--set gradient_accumulation_steps=4";
  const auto cpu = gradaccum::testing::train_steps(run, dir + "/cpu");
  const auto cuda = gradaccum::testing::train_steps(run + " --set device=cuda", dir + "/cuda");
  ASSERT_EQ(cpu.size(), 3u);
  ASSERT_EQ(cuda.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    std::cout << "step " << i + 1 << ": cpu " << cpu[i]["loss"] << " skipped " << cpu[i]["skipped"] << " scale "
              << cpu[i]["loss_scale"] << "; cuda " << cuda[i]["loss"] << " skipped " << cuda[i]["skipped"] << " scale "
              << cuda[i]["loss_scale"] << "\n";
    EXPECT_EQ(cuda[i]["skipped"], cpu[i]["skipped"]) << "step " << i + 1;
    EXPECT_EQ(cuda[i]["loss_scale"], cpu[i]["loss_scale"]) << "step " << i + 1;
    EXPECT_EQ(cuda[i]["items"], cpu[i]["items"]) << "step " << i + 1;
    // float16 keeps 11 bits: 2^-11 = 4.9e-4 per rounding.
    EXPECT_LE(relative_difference(cuda[i]["loss"].get<double>(), cpu[i]["loss"].get<double>()), 5e-3)
        << "step " << i + 1;
  }
  EXPECT_EQ(cpu[0]["skipped"], true);
  EXPECT_EQ(cpu[1]["loss_scale"], 32768.0);
  std::filesystem::remove_all(dir);
}

// Two NCCL ranks in threads, one GPU each, all-reduce a tensor whose sum is known.
TEST(GpuNccl, TwoRanksAllReduce) {
  SKIP_WITHOUT_CUDA();
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "fewer than two CUDA devices are visible";
#ifdef GRADACCUM_WITH_CUDA
  std::vector<double> sums(2);
  std::vector<std::thread> ranks;
  const int port = 29640;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      dist::DistEnvironment env;
      env.rank = rank;
      env.world_size = 2;
      env.local_rank = rank;
      env.local_world_size = 2;
      env.master_port = port;
      auto connection = dist::connect(env, std::chrono::seconds(60), c10::Device(torch::kCUDA, rank));
      std::vector<torch::Tensor> tensors{
          torch::full({4}, rank + 1.0, torch::TensorOptions(torch::kDouble).device(torch::kCUDA, rank))};
      connection.group->allreduce(tensors)->wait();
      sums[rank] = tensors[0].sum().item<double>();
      connection.group->shutdown();
    });
  }
  for (auto& r : ranks) r.join();
  EXPECT_EQ(sums[0], 4 * 3.0);
  EXPECT_EQ(sums[1], 4 * 3.0);
#endif
}

#ifdef GRADACCUM_WITH_CUDA
// Seed 000's MLP whose every micro-step also holds 64 MiB of CUDA memory per sample, as a large
// activation would, so that the caching allocator itself runs out of memory under a cap.
class ActivationHeavy final : public core::Trainable {
 public:
  static constexpr int64_t kBytesPerSample = int64_t{64} << 20;
  explicit ActivationHeavy(core::Trainable& inner) : inner_(inner) {}
  core::LossSum loss(const core::Batch& batch) override {
    const auto device = inner_.module().parameters().front().device();
    const auto activation = torch::empty({batch.samples, kBytesPerSample}, torch::dtype(torch::kByte).device(device));
    return inner_.loss(batch);
  }
  core::EvalSums evaluate(const core::Batch& batch) override { return inner_.evaluate(batch); }
  torch::nn::Module& module() override { return inner_.module(); }

 private:
  core::Trainable& inner_;
};

struct HeavyRun {
  std::vector<double> loss;
  std::vector<int64_t> micro_batch;
  std::vector<core::MicroBatchChange> changes;
  torch::Tensor weights;
};

// 6 steps of b × n over 96 samples in float64 on cuda:0.
HeavyRun train_heavy(int64_t b, int64_t n) {
  torch::manual_seed(0);
  auto x = torch::randn({96, 16}, torch::kDouble);
  auto y = torch::randn({96, 1}, torch::kDouble);
  gradaccum::testing::TensorDataset data(x, y);
  torch::manual_seed(1);
  models::Regressor net(models::seed000_mlp());
  ActivationHeavy model(net);
  auto o = gradaccum::testing::seed000_options(b, n, 6);
  o.device = torch::Device(torch::kCUDA, 0);
  struct Collect final : core::TrainingObserver {
    void on_step(const core::StepRecord& r) override {
      run.loss.push_back(r.loss);
      run.micro_batch.push_back(r.micro_batch_size);
    }
    void on_micro_batch_change(const core::MicroBatchChange& c) override { run.changes.push_back(c); }
    HeavyRun run;
  } collect;
  core::Trainer trainer(o, model, data, nullptr, collect, nullptr);
  trainer.run();
  collect.run.weights = gradaccum::testing::flat_params(net.module()).cpu();
  return collect.run;
}
#endif

// OOM recovery on a GPU: with the caching allocator capped at 1000 MiB above what this process
// holds after a first run, micro-batch 16 asks for 1 GiB at once and fails with CUDA's own
// out-of-memory error; the window is trained again at 8 × 4, which fits, and the run equals the
// first run, configured 8 × 4 from the start. The cap counts from what the first run leaves
// reserved: on an H100 (torch 2.11) one 546 MiB segment, held by cuBLAS's workspace (65 MiB stay
// allocated in it), which emptyCache cannot return.
TEST(GpuOom, TheAllocatorsOutOfMemoryHalvesTheMicroBatchAndKeepsTheTrajectory) {
  SKIP_WITHOUT_CUDA();
#ifdef GRADACCUM_WITH_CUDA
  const auto reference = train_heavy(8, 4);
  c10::cuda::CUDACachingAllocator::emptyCache();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  const auto held = stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  const double cap = static_cast<double>(held) + 1000.0 * (1 << 20);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(cap / static_cast<double>(total_bytes), 0);
  HeavyRun recovered;
  try {
    recovered = train_heavy(16, 2);
  } catch (...) {
    c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, 0);
    throw;
  }
  c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, 0);
  std::cout << "held before the capped run: " << (held >> 20) << " MiB\n";
  for (const auto& c : recovered.changes) {
    std::cout << "step " << c.step << ": " << c.from_micro_batch << " x " << c.from_accumulation << " -> "
              << c.to_micro_batch << " x " << c.to_accumulation << " (asked for " << c.requested_bytes << " bytes)\n";
  }
  ASSERT_EQ(recovered.changes.size(), 1u);
  EXPECT_EQ(recovered.changes[0].step, 1);
  EXPECT_EQ(recovered.changes[0].from_micro_batch, 16);
  EXPECT_EQ(recovered.changes[0].to_micro_batch, 8);
  EXPECT_EQ(recovered.changes[0].to_accumulation, 4);
  EXPECT_EQ(recovered.changes[0].requested_bytes, 16 * ActivationHeavy::kBytesPerSample);
  EXPECT_EQ(recovered.micro_batch, std::vector<int64_t>(6, 8));
  ASSERT_EQ(recovered.loss.size(), reference.loss.size());
  for (size_t i = 0; i < reference.loss.size(); ++i) {
    EXPECT_LE(relative_difference(recovered.loss[i], reference.loss[i]), 1e-12) << "step " << i + 1;
  }
  EXPECT_LE(gradaccum::testing::max_relative_difference(recovered.weights, reference.weights), 1e-12);
#endif
}

// `gradaccum plan` with device: cuda measures each micro-batch's peak in the caching allocator
// (exact and the same in every process); under a limit between micro-batch 8's and 16's peaks it
// keeps the global batch and picks a micro-batch that fits.
TEST(GpuCli, PlanMeasuresTheAllocatorsPeakAndKeepsTheGlobalBatch) {
  SKIP_WITHOUT_CUDA();
  const auto dir = gradaccum::testing::make_temp_dir("gpu-plan");
  const std::string plan =
      "plan " + tiny_gpt_run(dir) + " --set device=cuda --set model.n_embd=128 --global-batch 16 --steps 2 --json";
  const auto parse = [](const gradaccum::testing::CliResult& r) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out.substr(r.out.find('{')), nullptr, false);
  };
  const auto free_run = parse(gradaccum::testing::run_cli(plan + " --memory 60000"));
  ASSERT_TRUE(free_run.is_object());
  EXPECT_EQ(free_run["memory"], "CUDA peak allocated");
  const auto& candidates = free_run["candidates"];
  ASSERT_EQ(candidates.size(), 5u);  // 1, 2, 4, 8, 16
  for (size_t i = 1; i < candidates.size(); ++i) {
    EXPECT_GE(candidates[i]["peak_mb"].get<double>(), candidates[i - 1]["peak_mb"].get<double>()) << i;
  }
  const double p8 = candidates[3]["peak_mb"].get<double>(), p16 = candidates[4]["peak_mb"].get<double>();
  ASSERT_GT(p16, p8);
  const auto limited = parse(gradaccum::testing::run_cli(plan + fmt::format(" --memory {:.3f}", (p8 + p16) / 2)));
  ASSERT_TRUE(limited.is_object());
  EXPECT_EQ(limited["global_batch"].get<int64_t>(), 16);
  EXPECT_FALSE(limited["candidates"][4]["fits"].get<bool>());
  EXPECT_TRUE(limited["candidates"][3]["fits"].get<bool>());
  const int64_t b = limited["choice"]["per_device_train_batch_size"].get<int64_t>();
  EXPECT_LE(b, 8);
  EXPECT_EQ(b * limited["choice"]["gradient_accumulation_steps"].get<int64_t>(), 16);
  std::cout << "CUDA peaks (MB) for b = 1, 2, 4, 8, 16:";
  for (const auto& c : candidates) std::cout << " " << c["peak_mb"];
  std::cout << "\n";
  std::filesystem::remove_all(dir);
}

}  // namespace
