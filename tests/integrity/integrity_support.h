// Test support for the integrity fault tests: agents that restart on the same run dir and data
// port, a raw RPC client of kvmaster (to see placements as an agent does), a process's memory
// through /proc/PID/mem (to flip bytes in a node pool), and the SDK round trips the tests repeat
// (tcp_proxy.h, in tests/common, stands for the network between them). Every process and thread
// started here is stopped when its owner goes, pass or fail.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <flatbuffers/flatbuffers.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "kvagent/schemas/master_generated.h"
#include "master_stats.h"
#include "pipeline_support.h"

namespace kvagent::testing {

namespace mfb = kvagent::master_proto;

// The port of an endpoint "tcp://HOST:PORT".
inline uint16_t PortOf(const std::string& endpoint) {
  return static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
}

// A TCP port on 127.0.0.1 nobody listens on right now (bound and released).
inline uint16_t FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A kvagent that can be killed and started again on the same run dir with the same arguments
// (so the same --data-listen port, the same agent name: the restart the master sees as a new
// incarnation of the same agent).
class NodeAgent {
 public:
  // `prefix`: a command the agent runs under, e.g. NamespacePair::In or prlimit.
  explicit NodeAgent(Args args, Args prefix = {})
      : args_(std::move(args)), prefix_(std::move(prefix)) {
    run_dir_ = dir_.path() + "/run";
    Start();
  }
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Starts the agent with its arguments and then `extra` (later flags win).
  bool Start(const Args& extra = {}) {
    std::vector<std::string> args = {KVAGENT_BINARY,    "--run-dir", run_dir_,
                                     "--pool-size",     kPoolSize,   "--agent-name",
                                     "node-" + run_dir_};
    args.insert(args.end(), args_.begin(), args_.end());
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.begin(), prefix_.begin(), prefix_.end());
    const std::string socket = run_dir_ + "/agent.sock";
    unlink(socket.c_str());
    process_.Reset(SpawnQuiet(std::move(args)));
    started_ = WaitUntil([&] { return access(socket.c_str(), F_OK) == 0 || !process_.Running(); });
    started_ = started_ && process_.Running();
    return started_;
  }
  // SIGKILL and start again (with `extra` arguments for the new process only).
  bool Restart(const Args& extra = {}) {
    process_.Kill();
    return Start(extra);
  }
  // The size of every NodeAgent's pool: distinctive, so its mapping can be found (MappingOfSize).
  static constexpr const char* kPoolSize = "48MiB";
  static constexpr uint64_t kPoolBytes = uint64_t{48} << 20;
  void Kill() { process_.Kill(); }
  void Signal(int sig) { process_.Signal(sig); }
  bool started() const { return started_; }
  // "running", or how its process ended (a fault run's report of an agent that went away).
  std::string State() { return process_.State(); }
  pid_t pid() const { return process_.pid(); }
  const std::string& run_dir() const { return run_dir_; }

  std::unique_ptr<Client> Connect(uint64_t arena = 32 << 20) const {
    ClientOptions options;
    options.run_dir = run_dir_;
    options.arena_bytes = arena;
    options.client_name = "integrity-test";
    options.call_timeout = std::chrono::milliseconds(30000);
    auto client = Client::Connect(options);
    return client.ok() ? std::move(*client) : nullptr;
  }

 private:
  TempDir dir_;
  Args args_;
  Args prefix_;
  std::string run_dir_;
  ProcessGuard process_;
  bool started_ = false;
};

// ---- SDK round trips -------------------------------------------------------------------------

// One key's Put (put-if-absent) or Upsert (replaces), and its outcome.
inline KeyResult WriteValue(Client& c, bool upsert, const std::string& key,
                            const std::string& value, uint8_t replicas) {
  std::vector<std::string> keys = {key};
  std::vector<Value> values = {Value(std::string_view(value))};
  CallOptions o;
  o.write.replica_count = replicas;
  Reply r = upsert ? c.Upsert(keys, values, o) : c.Put(keys, values, o);
  if (r.keys.empty()) return KeyResult{r.status.code(), r.status.message()};
  return r.keys[0];
}
inline KeyResult PutValue(Client& c, const std::string& key, const std::string& value,
                          uint8_t replicas = 1) {
  return WriteValue(c, /*upsert=*/false, key, value, replicas);
}
inline KeyResult UpsertValue(Client& c, const std::string& key, const std::string& value,
                             uint8_t replicas = 1) {
  return WriteValue(c, /*upsert=*/true, key, value, replicas);
}

// The value of `key` (capacity `capacity`) and its code; the bytes only when the code is OK.
struct Read {
  ErrorCode code = ErrorCode::kInternal;
  std::string bytes;
  std::string message;
};
inline Read GetValue(Client& c, const std::string& key, size_t capacity) {
  Read out;
  auto buffer = c.Allocate(capacity);
  if (!buffer.ok()) return out;
  std::vector<std::string> keys = {key};
  std::vector<const ArenaBuffer*> targets = {&*buffer};
  Reply r = c.Get(keys, targets);
  out.code = r.keys.empty() ? r.status.code() : r.keys[0].code;
  out.message = r.keys.empty() ? r.status.message() : r.keys[0].message;
  if (out.code == ErrorCode::kOk) {
    out.bytes.assign(reinterpret_cast<const char*>(buffer->data()), r.keys[0].length);
  }
  return out;
}

inline bool KeyExists(Client& c, const std::string& key) {
  std::vector<std::string> keys = {key};
  Reply r = c.Exist(keys);
  return r.ok() && r.keys.size() == 1 && r.keys[0].exists;
}

// ---- kvmaster, seen as an agent sees it --------------------------------------------------------

// Where a key's replicas are, straight from kvmaster (a BatchGet over a DEALER).
struct Placed {
  uint32_t pool_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t incarnation = 0;  // the pool's (its agent's incarnation)
};
inline std::vector<Placed> PlacementsOf(const std::string& master, const std::string& key) {
  std::vector<Placed> out;
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 2000);
  dealer.connect(master);
  flatbuffers::FlatBufferBuilder b;
  std::vector<std::string> keys = {key};
  b.Finish(mfb::CreateRequest(b, 1, mfb::Body::BatchGet,
                              mfb::CreateBatchGet(b, b.CreateVectorOfStrings(keys)).Union()));
  dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  dealer.send(zmq::const_buffer(b.GetBufferPointer(), b.GetSize()), zmq::send_flags::none);
  zmq::message_t empty, body;
  if (!dealer.recv(empty) || !dealer.recv(body)) return out;
  // ZMQ may hand the body at any address; FlatBuffers reads it aligned (UBSan checks), so copy.
  const std::vector<uint8_t> bytes(static_cast<const uint8_t*>(body.data()),
                                   static_cast<const uint8_t*>(body.data()) + body.size());
  flatbuffers::Verifier verifier(bytes.data(), bytes.size());
  if (!verifier.VerifyBuffer<mfb::Reply>(nullptr)) return out;
  const auto* p = flatbuffers::GetRoot<mfb::Reply>(bytes.data())->body_as_PlacementReply();
  if (p == nullptr || p->placements() == nullptr || p->pools() == nullptr) return out;
  for (const mfb::Placement* pl : *p->placements()) {
    Placed x{pl->pool_id(), pl->offset(), pl->length(), 0};
    for (const mfb::PoolInfo* s : *p->pools()) {
      if (s->pool_id() == pl->pool_id()) x.incarnation = s->incarnation();
    }
    out.push_back(x);
  }
  return out;
}

// ---- another process's memory ------------------------------------------------------------------

// The start of `pid`'s readable and writable mapping that is exactly `size` bytes (a node pool
// of a distinctive size), or 0. (The reserve of a malloc arena, 64 MiB less what is in use, is
// not readable: it can be 48 MiB too.)
inline uint64_t MappingOfSize(pid_t pid, uint64_t size) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uint64_t begin = 0, end = 0;
    char dash = 0;
    std::string permissions;
    std::istringstream in(line);
    in >> std::hex >> begin >> dash >> end >> permissions;
    if (end - begin == size && permissions.rfind("rw", 0) == 0) return begin;
  }
  return 0;
}

// Reads or writes `n` bytes at `address` of process `pid` (root: /proc/PID/mem).
inline bool PokeMemory(pid_t pid, uint64_t address, const void* bytes, size_t n) {
  const int fd = open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDWR);
  if (fd < 0) return false;
  const bool ok = pwrite(fd, bytes, n, static_cast<off_t>(address)) == static_cast<ssize_t>(n);
  close(fd);
  return ok;
}
inline std::string PeekMemory(pid_t pid, uint64_t address, size_t n) {
  std::string out(n, '\0');
  const int fd = open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY);
  if (fd < 0) return "";
  const bool ok = pread(fd, out.data(), n, static_cast<off_t>(address)) == static_cast<ssize_t>(n);
  close(fd);
  return ok ? out : "";
}

}  // namespace kvagent::testing
