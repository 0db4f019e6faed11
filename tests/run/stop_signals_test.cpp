// Stop signals (run/stop_signals.h): copies of one request count once, a deliberate second
// request later stops at once. Each case runs in a forked child, whose fate is the answer.
#include "gradaccum/run/stop_signals.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace stop_signals_test {

using gradaccum::run::install_stop_signals;
using gradaccum::run::is_new_stop_request;
using gradaccum::run::kStopCopyInterval;

// Forks a child that installs the handlers and runs `signals`; returns its wait status.
template <typename F>
int status_of_child(F&& signals) {
  const pid_t pid = fork();
  if (pid == 0) {
    const auto& stop = install_stop_signals();
    signals();
    _exit(stop.load() ? 0 : 3);  // 0: alive with the stop requested
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(StopSignals, CopiesOfOneRequestWithinTheIntervalCountOnce) {
  const int status = status_of_child([] {
    // What GNU timeout does (the child, then its process group), and a launcher's forward after.
    raise(SIGTERM);
    raise(SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    raise(SIGTERM);
    raise(SIGINT);
  });
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(StopSignals, ADeliberateSecondRequestLaterStopsAtOnce) {
  const int status = status_of_child([] {
    raise(SIGTERM);
    std::this_thread::sleep_for(kStopCopyInterval + std::chrono::milliseconds(300));
    raise(SIGTERM);
    std::this_thread::sleep_for(std::chrono::seconds(2));  // not reached: the default action ends it
  });
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

TEST(StopSignals, TheRuleOnItsOwn) {
  const int64_t second = 1000000000;
  EXPECT_TRUE(is_new_stop_request(0, 5 * second));
  EXPECT_FALSE(is_new_stop_request(5 * second, 5 * second + 1));
  EXPECT_FALSE(is_new_stop_request(5 * second, 7 * second));  // the interval is 2 s, inclusive
  EXPECT_TRUE(is_new_stop_request(5 * second, 7 * second + 1));
}

}  // namespace stop_signals_test
