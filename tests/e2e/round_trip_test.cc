// A user's round trip with the shipped binaries, standalone and with a kvmaster process:
// kvctl puts a binary file (larger than a part, so stored in parts), another process reads it
// back byte for byte, kvctl removes it, and reads then fail with OBJECT_NOT_FOUND.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

#include "command_run.h"
#include "e2e_support.h"
#include "temp_dir.h"

namespace kvagent::testing {
namespace {

class RoundTrip : public ::testing::TestWithParam<Mode> {};

CommandOutput Kvctl(const Store& store, std::vector<std::string> args) {
  args.insert(args.begin(), {KVCTL_BINARY, "--run-dir", store.run_dir()});
  return RunCommand(args);
}

TEST_P(RoundTrip, KvctlPutOfAFileReadsBackExactlyAndRmMakesItNotFound) {
  // Parts of 256 KiB: the 3 MiB + 5 value is stored as 13 parts and read back whole.
  Store store(GetParam(),
              GetParam() == Mode::kStandalone ? Args{"--max-part-bytes", "256KiB"} : Args{},
              {"--max-part-bytes", "262144"});
  ASSERT_TRUE(store.started());
  TempDir files;
  const std::string in = files.path() + "/in.bin", out = files.path() + "/out.bin";
  const std::string value = Pattern("blob", (3 << 20) + 5);
  std::ofstream(in, std::ios::binary) << value;

  CommandOutput put = Kvctl(store, {"put", "blob/α", "--file", in, "--session", "operator-ø"});
  ASSERT_EQ(put.exit_code, 0) << put.err;
  CommandOutput get = Kvctl(store, {"get", "blob/α", "--out", out});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_TRUE(ReadFile(out) == value) << "kvctl get wrote other bytes than were put";

  // An SDK process of its own reads it back too, and lists it with the writer's session.
  auto reader = Connect(store.agent(), 8 << 20, "e2e-reader");
  ASSERT_TRUE(reader);
  auto buffer = reader->Allocate(value.size());
  ASSERT_TRUE(buffer.ok());
  std::vector<std::string> keys = {"blob/α"};
  std::vector<const ArenaBuffer*> targets = {&*buffer};
  Reply r = reader->Get(keys, targets);
  ASSERT_EQ(r.keys.at(0).code, ErrorCode::kOk) << r.keys[0].message;
  ASSERT_EQ(r.keys[0].length, value.size());
  EXPECT_EQ(std::memcmp(buffer->data(), value.data(), value.size()), 0);
  EXPECT_EQ(ListedSessions(*reader),
            (std::map<std::string, std::string>{{"blob/α", "operator-ø"}}));

  CommandOutput rm = Kvctl(store, {"rm", "blob/α", "--force"});  // the gets above hold leases
  ASSERT_EQ(rm.exit_code, 0) << rm.err;
  CommandOutput gone = Kvctl(store, {"get", "blob/α"});
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_NE(gone.err.find("OBJECT_NOT_FOUND"), std::string::npos) << gone.err;
  EXPECT_EQ(std::count(gone.err.begin(), gone.err.end(), '\n'), 1) << gone.err;
  r = reader->Get(keys, targets);
  EXPECT_EQ(r.keys.at(0).code, ErrorCode::kObjectNotFound);
  EXPECT_TRUE(ListedSessions(*reader).empty());
}

INSTANTIATE_TEST_SUITE_P(E2E, RoundTrip, ::testing::Values(Mode::kStandalone, Mode::kRemote),
                         ModeName);

}  // namespace
}  // namespace kvagent::testing
