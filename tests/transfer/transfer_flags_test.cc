#include "kvagent/transfer/transfer_flags.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvagent::transfer {
namespace {

// Parses `args` (without the program name) into `transfer`'s flags.
Status Parse(TransferFlags* transfer, std::vector<std::string> args) {
  FlagSet flags("kvagent", "test");
  transfer->Declare(&flags);
  args.insert(args.begin(), "kvagent");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return flags.Parse(static_cast<int>(argv.size()), argv.data());
}

TEST(TransferFlagsTest, DefaultsAreA1GibPoolAndAnAutoTransportOnEveryInterface) {
  TransferFlags transfer;
  ASSERT_TRUE(Parse(&transfer, {}).ok());
  auto pool = transfer.PoolOptions();
  auto engine = transfer.EngineOptions();
  ASSERT_TRUE(pool.ok() && engine.ok());
  EXPECT_EQ(pool->size_bytes, uint64_t{1} << 30);
  EXPECT_TRUE(pool->huge_pages);
  EXPECT_FALSE(pool->mlock);
  EXPECT_EQ(engine->listen_address, "0.0.0.0:0");
  EXPECT_EQ(engine->transport, TransportMode::kAuto);
  EXPECT_EQ(engine->peer_timeout, std::chrono::milliseconds(5000));
}

TEST(TransferFlagsTest, EveryFlagReachesTheOptions) {
  TransferFlags transfer;
  ASSERT_TRUE(
      Parse(&transfer, {"--pool-size", "64MiB", "--pool-mlock", "--pool-huge-pages=false",
                        "--data-listen", "10.0.0.2:7100", "--data-advertise-host", "10.0.0.2",
                        "--data-transport", "tcp", "--data-peer-timeout-ms", "250"})
          .ok());
  auto pool = transfer.PoolOptions();
  auto engine = transfer.EngineOptions();
  ASSERT_TRUE(pool.ok() && engine.ok());
  EXPECT_EQ(pool->size_bytes, uint64_t{64} << 20);
  EXPECT_TRUE(pool->mlock);
  EXPECT_FALSE(pool->huge_pages);
  EXPECT_EQ(engine->listen_address, "10.0.0.2:7100");
  EXPECT_EQ(engine->advertise_host, "10.0.0.2");
  EXPECT_EQ(engine->transport, TransportMode::kTcp);
  EXPECT_EQ(engine->peer_timeout, std::chrono::milliseconds(250));
}

TEST(TransferFlagsTest, BadValuesAreRejectedNamingTheFlag) {
  TransferFlags transport;
  ASSERT_TRUE(Parse(&transport, {"--data-transport", "infiniband"}).ok());
  EXPECT_NE(transport.EngineOptions().status().message().find("--data-transport"),
            std::string::npos);
  TransferFlags listen;
  ASSERT_TRUE(Parse(&listen, {"--data-listen", "myhost:7100"}).ok());
  EXPECT_NE(listen.EngineOptions().status().message().find("--data-listen"), std::string::npos);
  TransferFlags timeout;
  ASSERT_TRUE(Parse(&timeout, {"--data-peer-timeout-ms", "0"}).ok());
  EXPECT_NE(timeout.EngineOptions().status().message().find("--data-peer-timeout-ms"),
            std::string::npos);
  TransferFlags pool;
  ASSERT_TRUE(Parse(&pool, {"--pool-size", "0"}).ok());
  EXPECT_TRUE(pool.PoolOptions().status().IsInvalidParams());
}

}  // namespace
}  // namespace kvagent::transfer
