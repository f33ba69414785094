// ReplicationLog: the recent operation-log records of a master, numbered, for standbys.
//
// Every record the master appends to its operation log (metadata_persist.cc) is also appended
// here with the next sequence number (1, 2, ...). The log keeps the newest records up to a byte
// budget, in blocks of about 1 MiB, so appending allocates once per block, not per record. A
// standby that asks for the records after a sequence number the log still holds gets them; one
// that is further behind (or new) gets a snapshot of the whole state instead.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>

namespace kvagent::master {

class ReplicationLog {
 public:
  explicit ReplicationLog(uint64_t budget_bytes) : budget_(budget_bytes) {}

  bool enabled() const { return budget_ > 0; }
  // Appends one record as the sequence number last_seq() + 1.
  void Append(std::string_view payload);
  // The sequence number of the newest record (0 before the first).
  uint64_t last_seq() const { return next_seq_ - 1; }
  // Whether every record after `seq` is still held (true when nothing came after it).
  bool Covers(uint64_t seq) const;
  // Appends the records after `seq` (Covers(seq) must hold) to `out` as [u32 length LE]
  // [payload], stopping once `max_bytes` are reached (at least one record when there is one).
  // Returns the sequence number of the last record appended (`seq` when none).
  uint64_t ReadAfter(uint64_t seq, size_t max_bytes, std::string* out) const;

 private:
  struct Block {
    uint64_t first_seq = 0;
    uint64_t count = 0;
    std::string bytes;  // framed records
  };
  uint64_t budget_;
  uint64_t next_seq_ = 1;
  uint64_t bytes_ = 0;
  std::deque<Block> blocks_;
};

// Appends `payload` to `out` framed as [u32 length LE][payload].
void AppendFramedRecord(std::string_view payload, std::string* out);
// Calls `fn` with each payload of `bytes` (frames as AppendFramedRecord writes them), in order.
// False when a frame runs past the end (`fn` has then seen the frames before it).
bool ForEachFramedRecord(std::string_view bytes, const std::function<void(std::string_view)>& fn);

}  // namespace kvagent::master
