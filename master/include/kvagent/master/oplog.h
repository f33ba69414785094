// OpLog: the master's append-only operation log (`--state-dir DIR`, file DIR/master.oplog).
//
// Every persistent mutation of the metadata (agent registered or dropped, segment mounted,
// object committed, object removed) is one record, appended in the order the mutations happen.
// Records are framed as [u32 payload length LE][u32 FNV-1a checksum of the payload][payload]; a
// torn or corrupt tail (crash mid-write) ends the replay there and is cut off. The master replays
// the log at start and then rewrites it as a compact snapshot of the restored state (atomic
// rename), so the file stays proportional to the live metadata, not to its history.
//
// Durability: records reach the kernel (write(2)) at the end of every request (Flush), so they
// survive a crash of the master process; there is no fsync per request (a power loss can lose
// the last moments). Replication to standbys is not implemented.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kvagent/common/status.h"

namespace kvagent::master {

// Builds one record payload. Integers are little-endian; strings are u32 length + bytes.
class RecordWriter {
 public:
  explicit RecordWriter(std::string* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void U32(uint32_t v);
  void U64(uint64_t v);
  void Str(std::string_view s);

 private:
  std::string* out_;
};

// Reads one record payload; every read is bounds-checked and sets ok() false on overrun.
class RecordReader {
 public:
  explicit RecordReader(std::string_view in) : in_(in) {}
  uint8_t U8();
  uint32_t U32();
  uint64_t U64();
  std::string_view Str();
  bool ok() const { return ok_; }
  bool done() const { return pos_ == in_.size(); }

 private:
  bool Need(size_t n);
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

class OpLog {
 public:
  // Opens (creating DIR and the file when missing) DIR/master.oplog for appending.
  static Result<std::unique_ptr<OpLog>> Open(const std::string& dir);
  ~OpLog();
  OpLog(const OpLog&) = delete;
  OpLog& operator=(const OpLog&) = delete;

  // Calls `apply` with every intact record payload in order; stops at a torn or corrupt tail,
  // which is truncated away. Returns the number of records read.
  Result<uint64_t> Replay(const std::function<Status(std::string_view)>& apply);

  // Replaces the whole log with the records `write_all` appends through `append` (written to a
  // temporary file, then renamed over the log).
  Status Rewrite(
      const std::function<void(const std::function<void(std::string_view)>&)>& write_all);

  // Buffers one record; Flush() writes the buffer to the file.
  void Append(std::string_view payload);
  Status Flush();

  const std::string& path() const { return path_; }
  uint64_t records_appended() const { return records_; }

 private:
  OpLog(std::string dir, std::string path, int fd);
  static void Frame(std::string_view payload, std::string* out);

  std::string dir_;
  std::string path_;
  int fd_ = -1;
  std::string buffer_;
  uint64_t records_ = 0;
};

}  // namespace kvagent::master
