#include "kvagent/agent/agent.h"
#include "kvagent/common/errno_text.h"

#include <sys/stat.h>
#include <unistd.h>

#include <glog/logging.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

#include "acceptor.h"
#include "kvagent/ipc/segment.h"
#include "ring_service.h"

namespace kvagent::agent {

struct Agent::State {
  AgentConfig config;
  uint64_t incarnation = 0;
  std::unique_ptr<RequestHandler> handler;
  std::unique_ptr<RingService> service;
  std::unique_ptr<Acceptor> acceptor;
  bool stopped = false;
};

namespace {

// An incarnation of its own, for an agent started without one (AgentConfig::incarnation):
// clients tell one run of the agent from the next by it.
uint64_t DrawAgentIncarnation() {
  std::random_device rd;
  const uint64_t random = (uint64_t{rd()} << 32) | rd();
  const uint64_t now =
      static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return ((random ^ now) & 0x7FFFFFFFFFFFFFFFULL) | 1;  // never 0
}

Status CheckConfig(const AgentConfig& c) {
  if (c.max_clients < 1 || c.max_clients > kMaxClientsLimit) {
    return InvalidParams("--max-clients " + std::to_string(c.max_clients) +
                         " is out of range; use 1.." + std::to_string(kMaxClientsLimit) +
                         " (one futex_waitv call watches every client)");
  }
  if (c.max_clients_per_uid < 0 || c.max_clients_per_uid > c.max_clients) {
    return InvalidParams("--max-clients-per-uid " + std::to_string(c.max_clients_per_uid) +
                         " is out of range; use 0 (no cap per uid) up to --max-clients (" +
                         std::to_string(c.max_clients) + ")");
  }
  auto layout = ipc::SegmentLayout::Compute(c.ring_bytes, c.ring_bytes, 0);
  if (!layout.ok()) return layout.status();
  if (c.handshake_timeout.count() <= 0) {
    return InvalidParams("--handshake-timeout-ms must be positive");
  }
  if (c.max_ring_bytes < c.ring_bytes) {
    return InvalidParams("the ring size cap is below the default ring size");
  }
  if (c.max_ring_bytes > kMaxRingBytesLimit) {
    return InvalidParams("--max-ring-bytes " + std::to_string(c.max_ring_bytes) + " is above " +
                         std::to_string(kMaxRingBytesLimit) +
                         " (32 MiB): one request must fit in one kvmaster message");
  }
  return Status::Ok();
}

}  // namespace

Status MakeRunDir(const std::string& dir) {
  if (dir.empty()) return InvalidParams("--run-dir is empty");
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return Internal("cannot create run dir " + prefix + ": " + ErrnoText(errno) +
                      "; pick a writable --run-dir");
    }
  }
  return Status::Ok();
}

Agent::Agent(std::unique_ptr<State> state) : state_(std::move(state)) {}

Result<std::unique_ptr<Agent>> Agent::Start(AgentConfig config,
                                            std::unique_ptr<RequestHandler> handler) {
  KVAGENT_RETURN_IF_ERROR(CheckConfig(config));
  KVAGENT_RETURN_IF_ERROR(MakeRunDir(config.run_dir));
  auto state = std::make_unique<State>();
  state->config = std::move(config);
  state->incarnation =
      state->config.incarnation != 0 ? state->config.incarnation : DrawAgentIncarnation();
  state->handler = std::move(handler);
  std::unique_ptr<Agent> agent(new Agent(std::move(state)));
  State& s = *agent->state_;
  // The service reports corrupt clients to the acceptor, which owns their connections.
  s.service = std::make_unique<RingService>(s.handler.get(), s.config.spin,
                                            s.config.watchdog_interval, s.config.watchdog_status,
                                            [&s](ClientId id, const std::string&) {
                                              if (s.acceptor) s.acceptor->Disconnect(id);
                                            });
  s.acceptor = std::make_unique<Acceptor>(s.config, s.incarnation, s.service.get());
  s.service->Start();
  Status listening = s.acceptor->Start();
  if (!listening.ok()) {
    s.service->Stop();
    return listening;
  }
  LOG(INFO) << "kvagent pid " << getpid() << " incarnation " << s.incarnation << " serving "
            << s.config.SocketPath() << " (max " << s.config.max_clients << " clients"
            << (s.config.max_clients_per_uid > 0
                    ? ", " + std::to_string(s.config.max_clients_per_uid) + " per uid"
                    : std::string())
            << ", arena cap " << s.config.max_arena_bytes << " bytes, spin "
            << s.config.spin.count() << " us)";
  return agent;
}

void Agent::Stop() {
  if (state_->stopped) return;
  state_->stopped = true;
  // No new clients; then the shutdown words, so clients fail with "shutting down" rather than
  // a bare EOF; then every connection closes.
  state_->acceptor->StopAccepting();
  state_->service->Stop();
  state_->acceptor->Stop();
  LOG(INFO) << "kvagent stopped; socket removed, segments reclaimed";
}

Agent::~Agent() { Stop(); }

uint64_t Agent::incarnation() const { return state_->incarnation; }
size_t Agent::client_count() const { return state_->service->client_count(); }

}  // namespace kvagent::agent
