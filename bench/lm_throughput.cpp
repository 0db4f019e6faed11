// Language-model throughput (issue 3, item 7, fp32 and bf16): a GPT-2 of ~3.4M
// parameters (models::Gpt2LmHeadModel: vocab 8192, context 128, n_embd 192,
// 4 layers, 3 heads) trained by core::Trainer on random token ids (no
// tokenizer; labels = inputs, no padding) with micro-batch 8 × N = 4
// accumulation steps, AdamW lr 1e-3, cosine schedule, clipping at 1.0, exact
// window normalization (the engine's real accumulation path).
//
//   lm_throughput [--shape small|gpt2-124m|gpt2-124m-1024] [--device cpu|cuda] [--threads 2]
//                 [--warmup-steps 2] [--steps 10] [--mixed-precision no|bf16]
//                 [--loss-chunk-tokens K] [--profile] [--custom-kernels all|none|LIST]
//                 [--bf16-cpu-matmuls auto|float32|libtorch] [--accumulation N]
//                 [--deterministic-accumulation] [--dropout P] [--dropout-rng per_sample|libtorch]
//                 [--trace FILE]
//
// --shape gpt2-124m-1024 is GPT-2 small at its own context of 1024, 8 × 4 (a GPU's shape).
// --device cuda (a GRADACCUM_WITH_CUDA build) trains on the first CUDA device; the GEMM probes
// run there too and are timed after a device synchronize, as is every optimizer step (the
// Trainer reads each step's loss back). "peak_device_mb" is the CUDA caching allocator's peak
// of allocated memory (PyTorch's max_memory_allocated), 0 on the CPU.
//
// --custom-kernels and --bf16-cpu-matmuls are the config keys custom_kernels
// (kernels/custom_kernels.h) and bf16_cpu_matmuls of `gradaccum train`.
//
// --mixed-precision bf16 sets TrainerOptions::mixed_precision: the forward
// and the loss run under bfloat16 autocast, the backward outside it; weights,
// gradients and AdamW stay float32 (docs/mixed_precision.md). On a CPU without
// AVX-512 the bf16 matmuls run as float32 GEMMs on bfloat16-rounded operands, as
// in `gradaccum train` (kernels/float32_cpu_matmuls.h), and the GEMM peak is
// probed in float32; the Python peer keeps libtorch's bfloat16 GEMM.
//
// Before and after training, the same process measures the GEMM rate it can
// reach (the peak is the faster of the two probes):
// torch::mm of the model's own shapes (the four per-layer projections and the
// tied LM head, rows = 8 × 128 tokens), weighted by how often a forward uses
// each, and a 2048³ square for reference. The GEMMs run in the dtype the
// model's matmuls use: float32, or bfloat16 under bf16 (autocast's dtype), so
// the fraction of the GEMM peak compares like with like. Model FLOPs per token =
// 6 × P + 12 × n_layer × T × n_embd (P = the parameters that enter a matmul:
// all but the position table, the tied embedding counted once as the LM head;
// the second term is attention's scores and weighted sum, forward + backward).
//
// --loss-chunk-tokens K (default 0) is the config key loss_chunk_tokens of the
// fused LM-head loss (chunked_cross_entropy.h, which computes the head's
// gradients in its forward): 0 = automatic (~64 MiB of float32 logits on the CPU, here one
// chunk per micro-batch of the small shape; 512 MiB on a GPU), K > 0 = K tokens.
// bench/lm_loss_ab.cpp compares it with the unfused loss.
//
// --accumulation N replaces the shape's accumulation steps (micro-batch unchanged);
// --deterministic-accumulation sets TrainerOptions::deterministic_accumulation (core/canonical_sum.h:
// each micro-batch's gradient kept apart and added in the canonical tree), whose cost
// bench/deterministic_cost.py measures against the plain accumulation.
//
// Like `gradaccum`, the program keeps freed heap memory (kernels::retain_freed_heap).
//
// --dropout P sets GPT-2's resid_pdrop, embd_pdrop and attn_pdrop to P (default 0), drawn by
// --dropout-rng (model.dropout_rng, models/sample_dropout.h; default per_sample).
// --profile replaces the Trainer by the same loop written out (CausalLm::loss,
// LossNormalizer, StepSequence) with timers around forward, backward and the
// optimizer step, to see where the time goes; it is not the measured path.
// Under bf16 it wraps forward + loss in core::AutocastScope as the Trainer does.
//
// --trace FILE records the timed steps with libtorch's profiler (Kineto, CPU operators) and writes
// them to FILE as a Chrome trace; bench/op_profile.py compares it with the Python peer's trace
// operator by operator. The profiler slows every operator, so a traced run's speed is not reported
// as a result.
//
// Prints one JSON line; bench/py/lm_throughput.py is the Python peer and
// bench/compare_lm.py runs both alternately.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Version.h>
#include <torch/torch.h>
#ifdef GRADACCUM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "bench_support.h"
#include "gradaccum/base/check.h"
#include "gradaccum/core/loss_normalizer.h"
#include "gradaccum/core/mixed_precision.h"
#include "gradaccum/core/step_sequence.h"
#include "gradaccum/core/trainer.h"
#include "gradaccum/io/process_stats.h"
#include "gradaccum/kernels/cpu_and_blas.h"
#include "gradaccum/kernels/custom_kernels.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/gpt2.h"
#include "gradaccum/optim/optimizer_factory.h"
#include "gradaccum/run/process_setup.h"
#include "gradaccum/run/profiler_trace.h"
#include "gradaccum/run/runtime.h"

namespace {

using gradaccum::bench::median;
using gradaccum::bench::parse_count;

namespace core = gradaccum::core;
namespace kernels = gradaccum::kernels;
namespace models = gradaccum::models;
namespace run = gradaccum::run;
using Clock = std::chrono::steady_clock;

// The model and batch (--shape): `small`, the 3.4M GPT of the project's benchmarks, or
// `gpt2-124m`, GPT-2 small's shape (vocab 50257, 768 wide, 12 layers and heads; 124M
// parameters) with a context of 256 so that a step stays under a minute on 2 cores, at 2 × 8.
struct Shape {
  int64_t vocab, context, embd, layers, heads, micro_batch, accumulation;
};
constexpr Shape kSmall{8192, 128, 192, 4, 3, 8, 4};
constexpr Shape kGpt2Small{50257, 256, 768, 12, 12, 2, 8};
constexpr Shape kGpt2Small1024{50257, 1024, 768, 12, 12, 8, 4};

// Rows of random token ids [n, T] from a seeded generator; labels = inputs.
class RandomTokens final : public core::Dataset {
 public:
  RandomTokens(int64_t n, const Shape& shape) {
    auto generator = at::detail::createCPUGenerator(1234);
    ids_ = torch::randint(shape.vocab, {n, shape.context}, generator, torch::kLong);
  }
  int64_t size() const override { return ids_.size(0); }
  core::Batch get(const torch::Tensor& indices, torch::ScalarType) const override {
    core::Batch batch;
    batch.input = ids_.index_select(0, indices);
    batch.target = batch.input;
    batch.samples = indices.size(0);
    return batch;
  }

 private:
  torch::Tensor ids_;
};

class StepClock final : public core::TrainingObserver {
 public:
  void on_step(const core::StepRecord& r) override {
    ends.push_back(Clock::now());
    losses.push_back(r.loss);
  }
  std::vector<Clock::time_point> ends;
  std::vector<double> losses;
};

struct Options {
  int64_t threads = 2;
  int64_t warmup = 2;
  int64_t steps = 10;
  core::MixedPrecision precision = core::MixedPrecision::none;
  int64_t loss_chunk_tokens = 0;
  std::string custom_kernels = "all";
  core::Bf16CpuMatmuls bf16_cpu_matmuls = core::Bf16CpuMatmuls::automatic;
  bool profile = false;
  bool deterministic = false;
  std::string trace;
  double dropout = 0.0;
  models::DropoutRng dropout_rng = models::DropoutRng::per_sample;
  int64_t accumulation = 0;  // 0: the shape's
  std::string shape_name = "small";
  Shape shape = kSmall;
  torch::Device device = torch::kCPU;
};

// Throws gradaccum::Error on an unknown option, a missing value or fp16 (on
// CPU an emulation in float32, not a speed mode: docs/mixed_precision.md).
Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (key == "--profile") {
      o.profile = true;
      continue;
    }
    if (key == "--deterministic-accumulation") {
      o.deterministic = true;
      continue;
    }
    GA_CHECK(i + 1 < argc, "lm_throughput: option {} needs a value", key);
    const std::string value = argv[++i];
    if (key == "--threads") {
      o.threads = parse_count("lm_throughput", key, value);
    } else if (key == "--warmup-steps") {
      o.warmup = parse_count("lm_throughput", key, value);
    } else if (key == "--steps") {
      o.steps = parse_count("lm_throughput", key, value);
    } else if (key == "--accumulation") {
      o.accumulation = parse_count("lm_throughput", key, value);
      GA_CHECK(o.accumulation >= 1, "lm_throughput: --accumulation must be >= 1");
    } else if (key == "--dropout") {
      o.dropout = std::stod(value);
      models::check_dropout_probability("--dropout", o.dropout);
    } else if (key == "--trace") {
      o.trace = value;
    } else if (key == "--dropout-rng") {
      o.dropout_rng = models::dropout_rng_names().parse(value, "lm_throughput: --dropout-rng");
    } else if (key == "--loss-chunk-tokens") {
      o.loss_chunk_tokens = parse_count("lm_throughput", key, value);
    } else if (key == "--custom-kernels") {
      gradaccum::kernels::parse_custom_kernels(value);
      o.custom_kernels = value;
    } else if (key == "--bf16-cpu-matmuls") {
      o.bf16_cpu_matmuls = core::bf16_cpu_matmuls_names().parse(value, "lm_throughput: --bf16-cpu-matmuls");
    } else if (key == "--shape") {
      GA_CHECK(value == "small" || value == "gpt2-124m" || value == "gpt2-124m-1024",
               "lm_throughput: --shape is small, gpt2-124m or gpt2-124m-1024, not {}", value);
      o.shape_name = value;
      o.shape = value == "small" ? kSmall : value == "gpt2-124m" ? kGpt2Small : kGpt2Small1024;
    } else if (key == "--device") {
      GA_CHECK(value == "cpu" || value == "cuda", "lm_throughput: --device is cpu or cuda, not {}", value);
      o.device = value == "cpu" ? torch::Device(torch::kCPU) : torch::Device(torch::kCUDA, 0);
    } else if (key == "--mixed-precision") {
      o.precision = core::mixed_precision_names().parse(value, "--mixed-precision");
      GA_CHECK(o.precision != core::MixedPrecision::fp16,
               "lm_throughput: --mixed-precision fp16 is a float32 emulation on CPU; use no or bf16");
    } else {
      GA_CHECK(false, "lm_throughput: unknown option {}", key);
    }
  }
  if (o.device.is_cuda()) {
#ifndef GRADACCUM_WITH_CUDA
    GA_CHECK(false, "lm_throughput: --device cuda needs a build configured with -DGRADACCUM_WITH_CUDA=ON");
#endif
    GA_CHECK(torch::cuda::is_available(), "lm_throughput: --device cuda, but no CUDA device is visible");
    GA_CHECK(!o.profile,
             "lm_throughput: --profile times with host clocks, which on a GPU measure launches; "
             "it runs on the CPU only");
  }
  GA_CHECK(o.trace.empty() || (!o.profile && o.device.is_cpu() && o.warmup >= 1),
           "lm_throughput: --trace needs the Trainer on the CPU (no --profile) and --warmup-steps >= 1");
  GA_CHECK(!(o.profile && o.deterministic),
           "lm_throughput: --profile writes out the plain accumulation; drop --deterministic-accumulation");
  GA_CHECK(o.threads >= 1 && o.warmup >= 0 && o.steps >= 1 && o.loss_chunk_tokens >= 0,
           "lm_throughput: needs --threads >= 1, --warmup-steps >= 0, --steps >= 1, "
           "--loss-chunk-tokens >= 0");
  return o;
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Waits for the device's queued work (a no-op on the CPU, where every op has finished when it
// returns).
void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// The CUDA caching allocator's peak of allocated bytes, in MB; 0 on the CPU.
double peak_device_mb(const torch::Device& device) {
#ifdef GRADACCUM_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(
               stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak) /
           (1024.0 * 1024.0);
  }
#endif
  return 0.0;
}

// The device's name ("cpu" on the CPU).
std::string device_name(const torch::Device& device) {
#ifdef GRADACCUM_WITH_CUDA
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  return "cpu";
}

// FLOP/s of torch::mm([m, k] × [k, n]) in `dtype`: median of timed
// repetitions after one warm-up, repeated until `budget_s` has passed (at
// least 3 times).
double gemm_rate(int64_t m, int64_t k, int64_t n, torch::ScalarType dtype, const torch::Device& device,
                 double budget_s) {
  auto a = torch::randn({m, k}).to(device, dtype);
  auto b = torch::randn({k, n}).to(device, dtype);
  auto c = torch::mm(a, b);
  synchronize(device);
  std::vector<double> times;
  const auto start = Clock::now();
  while (times.size() < 3 || seconds(start, Clock::now()) < budget_s) {
    const auto t0 = Clock::now();
    torch::mm_out(c, a, b);
    synchronize(device);
    times.push_back(seconds(t0, Clock::now()));
  }
  return 2.0 * static_cast<double>(m * k * n) / median(times);
}

struct GemmShape {
  const char* name;
  int64_t k, n, uses;  // [tokens, k] × [k, n], `uses` times per forward
};

struct GemmPeak {
  double model = 0.0;   // FLOP/s of the forward shapes' mix, weighted by uses
  double square = 0.0;  // FLOP/s of 2048³
  std::string per_shape;
};

GemmPeak gemm_peak(torch::ScalarType dtype, const Shape& m, const torch::Device& device) {
  const int64_t tokens = m.micro_batch * m.context;
  const std::vector<GemmShape> shapes = {{"c_attn", m.embd, 3 * m.embd, m.layers},
                                         {"attn.c_proj", m.embd, m.embd, m.layers},
                                         {"c_fc", m.embd, 4 * m.embd, m.layers},
                                         {"mlp.c_proj", 4 * m.embd, m.embd, m.layers},
                                         {"lm_head", m.embd, m.vocab, 1}};
  GemmPeak peak;
  double mix_flops = 0.0, mix_time = 0.0;
  for (const auto& s : shapes) {
    const double rate = gemm_rate(tokens, s.k, s.n, dtype, device, 0.5);
    const double flops = 2.0 * static_cast<double>(tokens * s.k * s.n * s.uses);
    mix_flops += flops;
    mix_time += flops / rate;
    peak.per_shape += fmt::format("{}\"{}\": {:.2f}", peak.per_shape.empty() ? "" : ", ", s.name, rate / 1e9);
  }
  peak.model = mix_flops / mix_time;
  peak.square = gemm_rate(2048, 2048, 2048, dtype, device, 1.0);
  return peak;
}

}  // namespace

int main(int argc, char** argv) {
  Options opts;
  try {
    opts = parse_options(argc, argv);
  } catch (const gradaccum::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  const int64_t threads = opts.threads, warmup = opts.warmup, steps = opts.steps;
  const bool profile = opts.profile;
  const core::MixedPrecision precision = opts.precision;
  const torch::Device device = opts.device;
  // The process as `gradaccum train` sets it up: the custom_kernels switch, the threads, the
  // retained heap, and bf16 on a CPU without bfloat16 instructions running its matmuls as float32
  // GEMMs (bf16_cpu_matmuls: auto, kernels/float32_cpu_matmuls.h).
  run::ProcessSettings process;
  process.threads = threads;
  process.custom_kernels = opts.custom_kernels;
  process.cpu_matmuls_through_float32 = run::routes_cpu_matmuls_through_float32(
      opts.bf16_cpu_matmuls, precision, device, kernels::cpu_has_native_bf16(), kernels::cpu_has_native_fp16());
  process.retain_freed_heap = true;
  const run::ProcessSetup setup(process);
  const bool float32_bf16_matmuls = process.cpu_matmuls_through_float32;
  // The dtype of the model's matmuls: autocast's under bf16, unless routed to float32.
  const torch::ScalarType gemm_dtype =
      core::uses_autocast(precision, device) && !float32_bf16_matmuls ? core::autocast_dtype(precision) : torch::kFloat;
  torch::manual_seed(42);

  // The GEMM rate this process reaches, probed before and after training; the
  // peak is the faster probe (the rate is bimodal on this machine).
  Shape m = opts.shape;
  if (opts.accumulation > 0) m.accumulation = opts.accumulation;
  const GemmPeak before = gemm_peak(gemm_dtype, m, device);

  models::Gpt2Config config;
  config.vocab_size = m.vocab;
  config.n_positions = m.context;
  config.n_embd = m.embd;
  config.n_layer = m.layers;
  config.n_head = m.heads;
  config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = opts.dropout;
  config.dropout_rng = opts.dropout_rng;
  models::Gpt2LmHeadModel net(config);
  models::CausalLm model(net, opts.loss_chunk_tokens);
  int64_t parameters = 0;
  for (const auto& p : net->parameters()) parameters += p.numel();
  const int64_t matmul_parameters = parameters - m.context * m.embd;  // without wpe
  const double flops_per_token =
      6.0 * static_cast<double>(matmul_parameters) + 12.0 * static_cast<double>(m.layers * m.context * m.embd);

  const int64_t total_steps = warmup + steps;
  RandomTokens data(total_steps * m.micro_batch * m.accumulation, m);
  const int64_t tokens_per_step = m.micro_batch * m.accumulation * m.context;

  StepClock clock;
  Clock::time_point start;
  double t_forward = 0.0, t_backward = 0.0, t_step = 0.0;  // --profile, timed steps only
  if (!profile) {
    auto options = gradaccum::bench::adamw_trainer_options(m.micro_batch, m.accumulation, total_steps);
    options.sample_order = core::SampleOrder::sequential;  // the rows in stored order, as the Python peers
    options.mixed_precision = precision;
    options.device = device;
    options.deterministic_accumulation = opts.deterministic;
    // --trace: the steps after the warm-up, as `gradaccum train` traces with profile_from_step.
    core::ObserverList observers;
    observers.add(clock);
    std::optional<gradaccum::run::ProfilerTrace> trace;
    if (!opts.trace.empty()) {
      trace.emplace(warmup + 1, steps, opts.trace, /*cuda=*/false, /*resumed_step=*/-1);
      observers.add(*trace);
    }
    core::Trainer trainer(options, model, data, nullptr, observers);
    start = Clock::now();
    trainer.run();
  } else {
    // The Trainer's micro-step and step sequence, written out with timers.
    auto params = net->parameters();
    gradaccum::optim::OptimizerSpec spec;
    spec.learning_rate = 1e-3;
    auto optimizer = gradaccum::optim::make_optimizer(spec, params);
    core::StepSequence sequence(
        *optimizer, params, gradaccum::optim::LrSchedule(gradaccum::optim::ScheduleType::cosine, 1e-3, 0, total_steps),
        1.0);
    core::LossNormalizer normalizer(core::LossNormalization::window, m.accumulation);
    start = Clock::now();
    for (int64_t step = 0; step < total_steps; ++step) {
      const bool timed = step >= warmup;
      normalizer.begin_window();
      for (int64_t s = 0; s < m.accumulation; ++s) {
        const int64_t first = (step * m.accumulation + s) * m.micro_batch;
        const auto indices = torch::arange(first, first + m.micro_batch, torch::kLong);
        auto batch = data.get(indices, torch::kFloat);
        batch.keys = core::SampleKeys{indices, step + 1, 42};  // as the Trainer keys them
        const auto t0 = Clock::now();
        core::LossSum micro;
        {
          core::AutocastScope autocast(precision, device);
          micro = model.loss(batch);
        }
        auto objective = normalizer.objective(micro);
        const auto t1 = Clock::now();
        objective.backward();
        const auto t2 = Clock::now();
        if (timed) {
          t_forward += seconds(t0, t1);
          t_backward += seconds(t1, t2);
        }
      }
      const auto t0 = Clock::now();
      std::vector<torch::Tensor> grads;
      for (const auto& p : params) grads.push_back(p.grad());
      auto window_loss = normalizer.finish(normalizer.local_totals(), grads, 1);
      sequence.apply();
      clock.losses.push_back(window_loss.loss.item<double>());
      clock.ends.push_back(Clock::now());
      if (timed) t_step += seconds(t0, clock.ends.back());
    }
  }

  const GemmPeak after = gemm_peak(gemm_dtype, m, device);
  const double gemm_model = std::max(before.model, after.model);
  const double gemm_square = std::max(before.square, after.square);

  std::vector<double> step_s;
  for (int64_t s = warmup; s < total_steps; ++s) {
    step_s.push_back(seconds(s == 0 ? start : clock.ends[s - 1], clock.ends[s]));
  }
  const double timed_s = seconds(warmup == 0 ? start : clock.ends[warmup - 1], clock.ends.back());
  const double tokens_per_s = static_cast<double>(tokens_per_step * steps) / timed_s;
  const double model_flops = tokens_per_s * flops_per_token;
  std::string profile_json;
  if (profile) {
    const double n = static_cast<double>(steps);
    profile_json = fmt::format(
        ", \"profile_s_per_step\": {{\"forward_loss\": {:.4f}, \"backward\": {:.4f}, "
        "\"normalize_clip_adamw\": {:.4f}}}",
        t_forward / n, t_backward / n, t_step / n);
  }
  fmt::print(
      "{{\"program\": \"{}\", \"shape\": \"{}\", \"custom_kernels\": \"{}\", \"cpu_kernels\": \"{}\", "
      "\"mixed_precision\": \"{}\", \"gemm_dtype\": \"{}\", "
      "\"threads\": {}, \"loss_chunk_tokens\": {}, \"vocab\": {}, \"context\": {}, \"n_embd\": {}, "
      "\"n_layer\": {}, \"n_head\": {}, \"micro_batch\": {}, \"accum\": {}, \"parameters\": {}, "
      "\"matmul_parameters\": {}, \"flops_per_token\": {:.0f}, \"warmup_steps\": {}, \"steps\": {}, "
      "\"tokens_per_s\": {:.1f}, \"s_per_step\": {:.4f}, \"s_per_step_min\": {:.4f}, "
      "\"model_gflops\": {:.2f}, \"gemm_model_gflops\": {:.2f}, \"gemm_square_gflops\": {:.2f}, "
      "\"gemm_shapes_gflops\": {{{}}}, \"gemm_model_gflops_before_after\": [{:.2f}, {:.2f}], "
      "\"gemm_square_gflops_before_after\": [{:.2f}, {:.2f}], \"fraction_of_gemm_model\": {:.3f}, "
      "\"fraction_of_gemm_square\": {:.3f}, \"first_loss\": {:.4f}, \"final_loss\": {:.4f}, "
      "\"peak_rss_mb\": {:.1f}, \"device\": \"{}\", \"peak_device_mb\": {:.1f}, \"deterministic_accumulation\": {}, "
      "\"dropout\": {}, \"dropout_rng\": \"{}\"{}}}\n",
      profile ? "gradaccum-profile" : "gradaccum", opts.shape_name, kernels::custom_kernels_description(),
      at::get_cpu_capability(), core::to_string(precision), gemm_dtype == torch::kBFloat16 ? "bfloat16" : "float32",
      threads, opts.loss_chunk_tokens, m.vocab, m.context, m.embd, m.layers, m.heads, m.micro_batch, m.accumulation,
      parameters, matmul_parameters, flops_per_token, warmup, steps, tokens_per_s, median(step_s),
      *std::min_element(step_s.begin(), step_s.end()), model_flops / 1e9, gemm_model / 1e9, gemm_square / 1e9,
      before.per_shape, before.model / 1e9, after.model / 1e9, before.square / 1e9, after.square / 1e9,
      model_flops / gemm_model, model_flops / gemm_square, clock.losses.front(), clock.losses.back(),
      gradaccum::io::peak_rss_mb(), device_name(device), peak_device_mb(device), opts.deterministic, opts.dropout,
      models::to_string(opts.dropout_rng), profile_json);
  return 0;
}
