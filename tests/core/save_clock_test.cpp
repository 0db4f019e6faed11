// core/save_clock.h: a timed checkpoint is due when any rank's clock says so, every rank learns
// it from the window's totals, and a save restarts the clock; the program saves on that clock
// with one process and with two.
#include "gradaccum/core/save_clock.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "test_support.h"

namespace save_clock_test {

using gradaccum::core::host_value;
using gradaccum::core::SaveClock;
using gradaccum::core::WindowTotals;
namespace fs = std::filesystem;

WindowTotals zero_totals() {
  WindowTotals t;
  t.save_requests = torch::zeros({}, torch::kDouble);
  return t;
}

// The window state is not read by the clock; any window serves.
struct Fixture {
  gradaccum::core::WindowPlan plan{8, gradaccum::core::BatchGeometry::from_accumulation(2, 4, 1),
                                   gradaccum::core::LastWindow::partial, 7, gradaccum::core::SampleOrder::random};
  gradaccum::core::Window window = plan.window(plan.permutation(0), 0, 0);
  gradaccum::core::WindowState state{window, 0, 0};
};

TEST(SaveClock, DueWhenAnyRanksClockSaysSoAndNotAgainUntilTheIntervalAfterASave) {
  Fixture f;
  SaveClock off(0.0);
  auto totals = zero_totals();
  off.contribute(totals, f.state);
  EXPECT_EQ(host_value(totals.save_requests), 0.0);
  totals.save_requests.fill_(1.0);  // even where a peer asks: off is off
  off.after_host_read(totals);
  EXPECT_FALSE(off.due());

  SaveClock now(1e-9);  // due at once
  totals = zero_totals();
  now.contribute(totals, f.state);
  EXPECT_EQ(host_value(totals.save_requests), 1.0);
  EXPECT_FALSE(now.due());          // only the summed totals decide
  totals.save_requests.fill_(2.0);  // both ranks raised it
  now.after_host_read(totals);
  EXPECT_TRUE(now.due());
  now.saved();
  EXPECT_FALSE(now.due());

  // An hour away on this rank, but a peer's clock is due: this rank saves with it.
  SaveClock later(3600.0);
  totals = zero_totals();
  later.contribute(totals, f.state);
  EXPECT_EQ(host_value(totals.save_requests), 0.0);
  totals.save_requests.fill_(1.0);
  later.after_host_read(totals);
  EXPECT_TRUE(later.due());
  totals.save_requests.fill_(0.0);
  later.after_host_read(totals);
  EXPECT_FALSE(later.due());
}

// save_interval_s far below a step's time: a checkpoint after every step, on one process and on
// two ranks (which agree through the totals); an hour: only the end's.
TEST(SaveClock, TheProgramSavesOnTheClockWithOneAndTwoRanks) {
  const auto dir = gradaccum::testing::make_temp_dir("save-clock");
  const std::string run =
      "train --set model.type=mlp --set model.hidden=[16] --set data.train_limit=256 --set data.eval_limit=-1 "
      "--set max_steps=4 --set threads=1 --set per_device_train_batch_size=8 --set global_batch_size=32";
  for (const std::string ranks : {"", " --nproc 2"}) {
    for (const std::string interval : {"1e-6", "3600"}) {
      const auto out = dir + "/w" + (ranks.empty() ? "1" : "2") + "-" + interval;
      const auto r =
          gradaccum::testing::run_cli(run + ranks + " --set save_interval_s=" + interval + " --set output_dir=" + out);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      for (int step = 1; step <= 4; ++step) {
        const bool expected = interval != "3600" || step == 4;
        EXPECT_EQ(fs::exists(out + "/checkpoints/step-" + std::to_string(step) + "/manifest.json"), expected)
            << out << " step " << step;
      }
    }
  }
  fs::remove_all(dir);
}

}  // namespace save_clock_test
