// Operation-log record payloads written field by field (the layout in metadata_persist.cc), for
// tests that hand a master records it must refuse or survive.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvagent/master/oplog.h"

namespace kvagent::master::testing {

// Every record payload of DIR/master.oplog, in order (a failure to open or replay is a test
// failure, and whatever was read comes back).
inline std::vector<std::string> ReadLogRecords(const std::string& dir) {
  std::vector<std::string> out;
  auto log = OpLog::Open(dir);
  EXPECT_TRUE(log.ok()) << log.status().ToString();
  if (!log.ok()) return out;
  auto n = log.value()->Replay([&](std::string_view p) {
    out.emplace_back(p);
    return Status::Ok();
  });
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  return out;
}

inline std::string AgentRecordBytes(uint32_t id, const std::string& name) {
  std::string record;
  RecordWriter w(&record);
  w.U8(1);  // agent
  w.U32(id);
  w.U64(42);  // incarnation
  w.Str(name);
  return record;
}

// A version-2 object record of 64 bytes with no block metadata.
struct ObjectRecordFields {
  std::string key = "key";
  std::string session;
  uint8_t flags = 0;  // 1 hard pin, 2 soft pin
  uint64_t soft_pin_left_ms = 0;
  uint32_t replica_count = 1;  // as the record says; one replica follows whatever it says
  uint32_t pool = 3;
  uint32_t part = 0;
};

inline std::string ObjectRecordBytes(const ObjectRecordFields& f) {
  std::string record;
  RecordWriter w(&record);
  w.U8(6);  // object
  w.Str(f.key);
  w.U64(64);
  w.Str(f.session);
  w.U8(f.flags);
  w.U8(1);  // replicas per part
  w.U64(f.soft_pin_left_ms);
  w.U8(0);   // no block metadata
  w.U64(1);  // version
  w.U32(f.replica_count);
  w.U32(f.pool);
  w.U32(f.part);
  w.U64(0);   // offset
  w.U64(64);  // length
  w.U32(0);   // checksum
  w.U8(1);    // checksummed
  return record;
}

}  // namespace kvagent::master::testing
