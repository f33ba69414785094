// The ring-service thread is the one that pings systemd's watchdog: while a request handler
// blocks that thread (a hung service loop), the pings stop; when it returns, they go on.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "agent_process.h"
#include "kvagent/agent/agent.h"
#include "kvagent/client.h"
#include "notify_socket.h"

namespace kvagent::testing {
namespace {

using std::chrono::milliseconds;

// Blocks the service thread inside Handle() until released: the hang under test.
class HangingHandler final : public agent::RequestHandler {
 public:
  void Handle(agent::ClientRequest request, agent::CompletionSink& sink) override {
    std::unique_lock<std::mutex> lock(mu_);
    hung_ = true;
    cv_.notify_all();
    cv_.wait(lock, [this] { return released_; });
    sink.Complete(request.client_id, request.request_id,
                  agent::CompletionData::FailAll(Status(ErrorCode::kInternal, "released"),
                                                 request.key_count()));
  }
  void OnClientGone(agent::ClientId) override {}

  void WaitHung() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return hung_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hung_ = false;
  bool released_ = false;
};

TEST(RingServiceWatchdog, AHungServiceLoopStopsThePings) {
  TempDir dir;
  NotifySocket notify(dir.path() + "/notify");
  ASSERT_TRUE(notify.bound());
  setenv("NOTIFY_SOCKET", notify.path().c_str(), 1);

  agent::AgentConfig config;
  config.run_dir = dir.path() + "/run";
  config.watchdog_interval = std::chrono::microseconds(5000);
  config.watchdog_status = [] { return std::string("serving"); };
  auto owned = std::make_unique<HangingHandler>();
  HangingHandler* handler = owned.get();
  auto started = agent::Agent::Start(config, std::move(owned));
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  std::unique_ptr<agent::Agent>& agent = *started;

  // Idle: the service sleeps, yet wakes for every ping.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(notify.Next(), "WATCHDOG=1\nSTATUS=serving");

  ClientOptions options;
  options.run_dir = config.run_dir;
  options.arena_bytes = 1 << 20;
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Reply reply;
  std::thread caller([&] {
    const std::string key = "k";
    reply = (*client)->Exist(std::span<const std::string>(&key, 1));
  });
  handler->WaitHung();
  notify.Drain();
  EXPECT_EQ(notify.Next(milliseconds(200)), "");  // forty intervals without a ping
  handler->Release();
  caller.join();
  EXPECT_EQ(reply.status.message(), "released");  // the hung call itself went through
  EXPECT_EQ(notify.Next(), "WATCHDOG=1\nSTATUS=serving");

  client->reset();
  agent->Stop();
  unsetenv("NOTIFY_SOCKET");
}

}  // namespace
}  // namespace kvagent::testing
