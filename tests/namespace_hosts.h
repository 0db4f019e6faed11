// K "hosts" on one machine for the multi-host tests: network namespaces, each with one interface
// eth0 at 10.231.0.<i+1>/24, cabled by veth pairs to a bridge that lives in a namespace of its
// own. The hosts reach each other and nothing else; no address or link is added to the machine's
// own namespace, and the names carry this test process's pid, so tests running side by side each
// have their own network. The destructor removes everything (a test killed before it ran leaves
// namespaces that `ip netns list` shows under ga<pid>-).
#pragma once

#include <string>
#include <vector>

namespace gradaccum::testing {

class NamespaceHosts {
 public:
  explicit NamespaceHosts(int hosts);
  ~NamespaceHosts();
  NamespaceHosts(const NamespaceHosts&) = delete;
  NamespaceHosts& operator=(const NamespaceHosts&) = delete;

  // Empty when the hosts exist; otherwise why they could not be made (not root, no `ip`, a
  // kernel or container without network namespaces), for the test's skip.
  const std::string& why_not() const { return why_not_; }
  int size() const { return hosts_; }
  std::string address(int host) const;  // 10.231.0.<host+1>
  static constexpr const char* kInterface = "eth0";

  // The shell command line that runs `command` (a shell command line) on `host`, with
  // GLOO_SOCKET_IFNAME naming its interface.
  std::string on(int host, const std::string& command) const;
  // Takes the host's cable out of the bridge (down) or puts it back (up): its peers see a link
  // that carries nothing, not closed connections.
  void set_link(int host, bool up) const;
  // tc netem on the host's interface ("delay 50ms", "loss 20%"; "" removes it).
  void set_netem(int host, const std::string& args) const;
  // SIGKILL to every process in the host's namespace: a host lost with its agent and workers.
  void kill_host(int host) const;

 private:
  std::string host_ns(int host) const;
  std::string switch_ns() const;
  void remove() const;

  int hosts_;
  std::string prefix_;
  std::string why_not_;
};

}  // namespace gradaccum::testing
