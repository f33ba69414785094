// Test suites that run once per transport between an agent and kvmaster: ZMQ (a DEALER to the
// ROUTER) and the framed one (kvmaster --framed-listen; docs/protocol.md "Framed RPC"). A suite
// derives from (or aliases) MasterTransports and is instantiated with
//   INSTANTIATE_TEST_SUITE_P(Transports, Suite, kMasterTransports, MasterTransportName);
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace kvagent::testing {

class MasterTransports : public ::testing::TestWithParam<bool> {
 protected:
  bool framed() const { return GetParam(); }  // else ZMQ
};

inline const auto kMasterTransports = ::testing::Values(false, true);

inline std::string MasterTransportName(const ::testing::TestParamInfo<bool>& info) {
  return info.param ? "framed" : "zmq";
}

}  // namespace kvagent::testing
