#include "namespace_hosts.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace gradaccum::testing {

namespace {
// Runs a shell command line quietly; true when it exits 0.
bool sh(const std::string& command) {
  const int status = std::system(("{ " + command + "; } > /dev/null 2>&1").c_str());
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
}  // namespace

NamespaceHosts::NamespaceHosts(int hosts) : hosts_(hosts), prefix_(fmt::format("ga{}-", ::getpid())) {
  if (::geteuid() != 0) {
    why_not_ = "making network namespaces needs root";
    return;
  }
  if (!sh("command -v ip")) {
    why_not_ = "`ip` (iproute2) is not installed";
    return;
  }
  remove();
  const std::string sw = switch_ns();
  if (!sh(fmt::format("ip netns add {0} && ip -n {0} link set lo up", sw))) {
    why_not_ = "`ip netns add` failed: this kernel or container does not allow network namespaces";
    remove();
    return;
  }
  std::vector<std::string> steps{fmt::format("ip -n {0} link add br0 type bridge && ip -n {0} link set br0 up", sw)};
  for (int h = 0; h < hosts_; ++h) {
    const auto ns = host_ns(h);
    steps.push_back(fmt::format("ip netns add {0} && ip -n {0} link set lo up", ns));
    steps.push_back(fmt::format("ip link add {} netns {} type veth peer name h{} netns {}", kInterface, ns, h, sw));
    steps.push_back(
        fmt::format("ip -n {0} addr add {1}/24 dev {2} && ip -n {0} link set {2} up", ns, address(h), kInterface));
    steps.push_back(fmt::format("ip -n {0} link set h{1} master br0 && ip -n {0} link set h{1} up", sw, h));
  }
  for (const auto& step : steps) {
    if (!sh(step)) {
      why_not_ = "making the namespace hosts failed at `" + step + "`";
      remove();
      return;
    }
  }
}

NamespaceHosts::~NamespaceHosts() {
  if (why_not_.empty()) remove();
}

std::string NamespaceHosts::address(int host) const { return fmt::format("10.231.0.{}", host + 1); }

std::string NamespaceHosts::host_ns(int host) const { return prefix_ + "h" + std::to_string(host); }
std::string NamespaceHosts::switch_ns() const { return prefix_ + "sw"; }

std::string NamespaceHosts::on(int host, const std::string& command) const {
  return fmt::format("ip netns exec {} env GLOO_SOCKET_IFNAME={} sh -c '{}'", host_ns(host), kInterface, command);
}

void NamespaceHosts::set_link(int host, bool up) const {
  sh(fmt::format("ip -n {} link set h{} {}", switch_ns(), host, up ? "up" : "down"));
}

void NamespaceHosts::set_netem(int host, const std::string& args) const {
  const auto ns = host_ns(host);
  sh(fmt::format("ip netns exec {} tc qdisc del dev {} root", ns, kInterface));
  if (!args.empty()) sh(fmt::format("ip netns exec {} tc qdisc add dev {} root netem {}", ns, kInterface, args));
}

void NamespaceHosts::kill_host(int host) const {
  sh(fmt::format("ip netns pids {} | xargs -r kill -9", host_ns(host)));
}

void NamespaceHosts::remove() const {
  // Processes first: a namespace with processes in it lives on after `ip netns del`.
  for (int h = 0; h < hosts_; ++h) {
    kill_host(h);
    sh("ip netns del " + host_ns(h));
  }
  sh("ip netns del " + switch_ns());
}

}  // namespace gradaccum::testing
