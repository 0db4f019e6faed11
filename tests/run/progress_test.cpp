// run::Progress, the console lines of a run: rates keep about three significant digits, so that
// a pretrained model that trains under one sample a second does not print "0 samples/s".
#include "gradaccum/run/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace progress_test {

using gradaccum::core::StepRecord;

std::string lines_for(const std::vector<double>& rates) {
  FILE* out = std::tmpfile();
  EXPECT_NE(out, nullptr);
  gradaccum::run::Progress progress(out, /*terminal=*/false, /*logging_steps=*/1);
  gradaccum::core::RunInfo info{gradaccum::core::BatchGeometry::from_accumulation(1, 16, 1)};
  info.total_steps = static_cast<int64_t>(rates.size());
  info.windows_per_epoch = info.total_steps;
  progress.on_start(info);
  for (size_t i = 0; i < rates.size(); ++i) {
    StepRecord r;
    r.step = static_cast<int64_t>(i) + 1;
    r.loss = 0.5;
    r.lr = 5e-5;
    r.grad_norm = 1.25;
    r.samples = 16;
    r.samples_per_s = rates[i];
    progress.on_step(r);
  }
  std::rewind(out);
  std::string text;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, out) != nullptr) text += buffer;
  std::fclose(out);
  return text;
}

TEST(Progress, StepLinesShowRatesWithThreeSignificantDigits) {
  const auto text = lines_for({0.4523, 12.345, 6378.2});
  EXPECT_NE(text.find("step 1/3 epoch 0 loss 0.5000 lr 5.000e-05 grad_norm 1.2500 0.45 samples/s\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("grad_norm 1.2500 12.3 samples/s\n"), std::string::npos) << text;
  EXPECT_NE(text.find("grad_norm 1.2500 6378 samples/s\n"), std::string::npos) << text;
}

}  // namespace progress_test
