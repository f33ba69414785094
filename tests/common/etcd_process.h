// Test support: a real single-member etcd (Debian's etcd-server) on loopback with a data dir of
// the test's own and ports nobody uses, stopped (SIGKILL + waitpid) when the test ends. It can be
// killed, stopped, restarted on the same ports and data, started inside a network namespace, or
// serve its clients over TLS, with etcd's user authentication on.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "kvagent/coord/etcd_client.h"
#include "process_guard.h"

namespace kvagent::testing {

inline constexpr const char* kEtcdBinary = "/usr/bin/etcd";
inline constexpr const char* kEtcdctlBinary = "/usr/bin/etcdctl";

// A TCP port on `host` nobody listens on right now (bound and released); 0 when none could be
// bound (the caller fails).
inline uint16_t UnusedPort(const char* host = "127.0.0.1") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, host, &a.sin_addr);
  socklen_t len = sizeof(a);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

// Starts `args` (argv[0] a path) with its standard output and error appended to `log`.
inline pid_t SpawnLogged(std::vector<std::string> args, const std::string& log) {
  const ExecArgs command(std::move(args));
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    command.Exec();
  }
  return pid;
}

class EtcdProcess {
 public:
  // `data_dir` must exist and outlive the process; `prefix` is a command etcd runs under (e.g.
  // `ip netns exec NS`), `host` the address it serves on.
  // `also_listen`: more addresses it serves clients on, with the same port (e.g. the outer end
  // of a veth pair, for members in a network namespace).
  explicit EtcdProcess(std::string data_dir, std::string host = "127.0.0.1",
                       std::vector<std::string> prefix = {},
                       std::vector<std::string> also_listen = {})
      : data_dir_(std::move(data_dir)),
        host_(std::move(host)),
        prefix_(std::move(prefix)),
        also_listen_(std::move(also_listen)) {}
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // Before Start: serve clients over TLS with `cert` and `key`, asking each for a certificate
  // signed by `ca` (--client-cert-auth); `probe` is how Start's readiness check reaches it.
  void ServeTls(std::string cert, std::string key, std::string ca, coord::EtcdTls probe) {
    tls_args_ = {"--cert-file",       std::move(cert), "--key-file",        std::move(key),
                 "--trusted-ca-file", std::move(ca),   "--client-cert-auth"};
    probe_ = std::move(probe);
    probe_.enabled = true;
  }

  // After Start with ServeTls: turns on etcd's user authentication (etcdctl, as the client of
  // ServeTls's probe): a root user, and `user` with `password` allowed to read and write the
  // keys under each of `prefixes` only. False when etcdctl failed (its output in the log).
  bool EnableAuth(const std::string& user, const std::string& password,
                  const std::vector<std::string>& prefixes) {
    auto etcdctl = [&](std::vector<std::string> args) {
      std::string command = std::string(kEtcdctlBinary) + " --endpoints=https://" + endpoint() +
                            " --cacert=" + probe_.ca_file + " --cert=" + probe_.cert_file +
                            " --key=" + probe_.key_file;
      for (const std::string& a : args) command += " '" + a + "'";
      return std::system((command + " >>" + log_ + " 2>&1").c_str()) == 0;
    };
    root_password_ = "root-" + password;
    bool ok = etcdctl({"user", "add", "root", "--new-user-password=" + root_password_}) &&
              etcdctl({"user", "add", user, "--new-user-password=" + password}) &&
              etcdctl({"role", "add", "kvagent-test"});
    for (const std::string& p : prefixes) {
      ok = ok &&
           etcdctl({"role", "grant-permission", "kvagent-test", "readwrite", p, "--prefix=true"});
    }
    return ok && etcdctl({"user", "grant-role", user, "kvagent-test"}) &&
           etcdctl({"auth", "enable"});
  }

  // After EnableAuth: gives `user` another password (etcdctl as root). False when etcdctl failed.
  bool ChangePassword(const std::string& user, const std::string& password) {
    const std::string command =
        "echo '" + password + "' | " + kEtcdctlBinary + " --endpoints=https://" + endpoint() +
        " --cacert=" + probe_.ca_file + " --cert=" + probe_.cert_file +
        " --key=" + probe_.key_file + " --user 'root:" + root_password_ + "' user passwd '" + user +
        "' --interactive=false >>" + log_ + " 2>&1";
    return std::system(command.c_str()) == 0;
  }

  // Starts etcd (again, on the same ports and data) and waits until it answers. False when it
  // did not come up (then on fresh ports, a few times: another test may have taken one).
  bool Start() {
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (client_port_ == 0 || attempt > 0) {
        client_port_ = UnusedPort(host_.c_str());
        peer_port_ = UnusedPort(host_.c_str());
      }
      if (Launch()) return true;
      if (fixed_ports_) return false;
    }
    return false;
  }
  // Restarts on the same ports and data (after Kill or Stop).
  bool Restart() {
    process_.Kill();
    fixed_ports_ = true;
    for (int attempt = 0; attempt < 50; ++attempt) {
      if (Launch()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  void Kill() { process_.Kill(); }
  void Signal(int sig) { process_.Signal(sig); }
  pid_t pid() const { return process_.pid(); }

  std::string endpoint() const { return host_ + ":" + std::to_string(client_port_); }
  uint16_t port() const { return client_port_; }
  // kvmaster's --etcd: https://HOST:PORT when it serves TLS, else HOST:PORT.
  std::string url() const { return (probe_.enabled ? "https://" : "") + endpoint(); }
  std::string ClusterUrl(const std::string& cluster) const {
    return (probe_.enabled ? "etcds://" : "etcd://") + endpoint() + "/" + cluster;
  }
  const std::string& log_path() const { return log_; }

 private:
  bool Launch() {
    if (client_port_ == 0 || peer_port_ == 0) return false;
    const std::string scheme = probe_.enabled ? "https://" : "http://";
    const std::string client = scheme + host_ + ":" + std::to_string(client_port_);
    std::string listen = client;
    for (const std::string& h : also_listen_) {
      listen += "," + scheme + h + ":" + std::to_string(client_port_);
    }
    const std::string peer = "http://" + host_ + ":" + std::to_string(peer_port_);
    log_ = data_dir_ + "/etcd.log";
    std::vector<std::string> args = prefix_;
    const std::vector<std::string> own = {
        kEtcdBinary, "--name", "test", "--data-dir", data_dir_ + "/etcd", "--listen-client-urls",
        listen, "--advertise-client-urls", client, "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer, "--initial-cluster", "test=" + peer, "--log-level",
        "warn",
        // As docs/operations.md advises for a LAN: etcd's
        // minimum lease is then 1 s (the members' default).
        "--heartbeat-interval", "50", "--election-timeout", "500"};
    args.insert(args.end(), own.begin(), own.end());
    args.insert(args.end(), tls_args_.begin(), tls_args_.end());
    const pid_t pid = SpawnLogged(args, log_);
    process_.Reset(pid);
    auto client_api =
        coord::EtcdClient::Create({{endpoint()}, std::chrono::milliseconds(500), probe_});
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until && process_.Running()) {
      // Ready once etcd answers, whatever (with its authentication on, a probe without a user
      // is refused: an answer too).
      if (client_api.ok() &&
          (*client_api)->Get("/ready-probe").status().code() != ErrorCode::kMasterUnavailable) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    process_.Kill();
    return false;
  }

  std::string data_dir_;
  std::string host_;
  std::vector<std::string> prefix_;
  std::vector<std::string> also_listen_;
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  bool fixed_ports_ = false;
  std::vector<std::string> tls_args_;
  coord::EtcdTls probe_;
  std::string root_password_;
  std::string log_;
  ProcessGuard process_;
};

}  // namespace kvagent::testing
