// Several data-parallel ranks inside one test process: one thread per rank,
// each with its own Gloo process group over a shared in-process HashStore.
#pragma once

#include <exception>
#include <functional>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

namespace gradaccum::testing {

// Runs body(group, rank) for rank = 0 .. world-1 side by side and waits for
// all of them; an exception thrown on any rank is rethrown here.
inline void run_on_ranks(int world, const std::function<void(const c10::intrusive_ptr<c10d::Backend>&, int)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        // A rank that fails to connect leaves the others waiting for it in the store: bounded,
        // so such a failure ends the test instead of hanging it.
        auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(120));
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        c10::intrusive_ptr<c10d::Backend> group =
            c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
        body(group, rank);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace gradaccum::testing
