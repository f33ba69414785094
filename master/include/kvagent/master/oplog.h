// OpLog: the master's write-ahead operation log (`--state-dir DIR`, file DIR/master.oplog).
//
// Every persistent mutation of the metadata (agent registered or dropped, pool mounted,
// object committed, object removed) is one record, appended in the order the mutations happen.
// The master reserves room for a mutation's records before it changes anything in memory
// (Reserve: the space is preallocated on disk with fallocate), so a full disk refuses the
// mutation instead of leaving memory ahead of the log; the records reach the file before the
// reply that acknowledges them leaves (Flush; with LogSync::kFsync also fdatasync).
//
// File format (version 2): a 16-byte header "KVOPLOG" 0x02 | u32 version | u32 0, then records
// framed as [u32 magic "KVRC"][u32 payload length][u32 CRC32C of length and payload][payload],
// integers little-endian. Replay tells a torn tail (the last record cut short by a crash: cut off
// with a warning) from damage in the middle (a bad record with intact records after it: the
// start fails, naming the file, the offset and the choices, unless the caller allows cutting
// there). Version 1 files (no header; [u32 length][u32 FNV-1a][payload] frames) are read, and
// rewritten as version 2 by the compaction that follows every start.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kvagent/common/status.h"
#include "kvagent/master/types.h"

namespace kvagent::master {

class ForkedWriter;

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
  size_t remaining() const { return in_.size() - pos_; }

 private:
  bool Need(size_t n);
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

struct OpLogOptions {
  LogSync sync = LogSync::kWrite;
  // Open/Replay: cut the file at a damaged record in the middle (keeping the records before it)
  // instead of failing.
  bool truncate_damaged = false;
  // Disk space preallocated at a time ahead of the records (at least what one Reserve asks).
  uint64_t reserve_chunk = 1 << 20;
};

class OpLog {
 public:
  // Bytes a record of `payload` bytes takes in the file.
  static constexpr uint64_t kFrameBytes = 12;
  // The largest payload replay reads back (a larger length marks a damaged record). What the
  // master writes stays below it: the requests' limits bound every record.
  static constexpr uint32_t kMaxRecordBytes = 64u << 20;

  // Opens (creating DIR and the file when missing) DIR/master.oplog for appending.
  static Result<std::unique_ptr<OpLog>> Open(const std::string& dir, OpLogOptions options = {});
  ~OpLog();
  OpLog(const OpLog&) = delete;
  OpLog& operator=(const OpLog&) = delete;

  // Calls `apply` with every intact record payload in order and returns how many there were.
  // A torn tail is cut off (logged). A record that fails its checksum, or that `apply` rejects,
  // with intact records after it is damage: INTERNAL naming the file, the offset and what to do
  // (or, with options.truncate_damaged, the file is cut there and replay ends, logged).
  // `apply` errors are reported the same way.
  Result<uint64_t> Replay(const std::function<Status(std::string_view)>& apply);

  // Replaces the whole log with the records `write_all` appends through `append` (written to a
  // temporary file, synced, then renamed over the log). On failure the old log stays.
  Status Rewrite(
      const std::function<void(const std::function<void(std::string_view)>&)>& write_all);

  // The same replacement, built in the background: a child process (fork) writes the records
  // `write_all` appends from its copy of this process's memory as it was at the call, while
  // this process goes on appending; the records flushed meanwhile are kept and appended to the
  // new file before it replaces the log (FinishRewrite). So a large state costs the caller the
  // fork (page tables, copied on write), not the whole snapshot. The buffered records are
  // flushed first: the child's state is exactly the file's. `write_all` runs in the child, where
  // it must not log nor take a lock another thread may hold (malloc is safe). INTERNAL when no
  // child could start (the caller may Rewrite instead) or a rewrite runs already.
  Status StartRewrite(
      const std::function<void(const std::function<void(std::string_view)>&)>& write_all);
  // Whether a background rewrite runs (started and not finished or given up).
  bool rewriting() const { return rewrite_ != nullptr; }
  // Periodic while rewriting(): false while the child is still writing; once it is done, true
  // with `*status` OK when the new file replaced the log, or the reason it did not (the old log
  // stays, whole, and takes records as before).
  bool FinishRewrite(Status* status);
  // Gives up a background rewrite (its child is killed, its file removed); the old log stays.
  void AbandonRewrite();

  // Makes sure `payload_bytes` more bytes in `records` records can be appended and flushed
  // without the file system running out of space (preallocated with fallocate). False when the
  // state dir cannot give them: writable() turns false and error() says why, until a later
  // Reserve or Probe succeeds. Retries the disk at most every 100 ms while refusing.
  bool Reserve(uint64_t payload_bytes, uint64_t records = 1);
  // Asks the disk again for a chunk of room (periodic work while not writable, whatever the
  // pause); true when writable.
  bool Probe();
  bool writable() const { return writable_; }
  const std::string& error() const { return error_; }

  // Buffers one record (within what Reserve granted); Flush() writes the buffer to the file.
  void Append(std::string_view payload);
  // Writes the buffered records; with LogSync::kFsync also fdatasync. An error leaves the file
  // as it was before the call (a partial write is cut off again) and drops the buffered
  // records: none of them is in the log, and a caller that still wants them appends them again.
  Status Flush();

  // True after replaying a version-1 file: it must be rewritten (Rewrite) before Append.
  bool needs_rewrite() const { return needs_rewrite_; }
  const std::string& path() const { return path_; }
  uint64_t records_appended() const { return records_; }
  uint64_t file_bytes() const { return file_bytes_; }

 private:
  OpLog(std::string dir, std::string path, int fd, OpLogOptions options);
  static void Frame(std::string_view payload, std::string* out);
  Status ReplayV1(std::string_view data, const std::function<Status(std::string_view)>& apply,
                  uint64_t* count);
  Status CutAt(uint64_t offset, const std::string& why);
  bool Preallocate(uint64_t end);

  // A rewrite a child process is writing (StartRewrite).
  struct BackgroundRewrite {
    std::unique_ptr<ForkedWriter> child;
    int fd = -1;            // the new file (the child writes it through the same description)
    std::string tail;       // records flushed into the old file since the fork, framed
    bool too_long = false;  // the tail passed kMaxRewriteTail: given up at the next finish
  };
  Status Install(int fd, const std::string& tmp);
  // Writes a whole log file (the header, then every record `write_all` appends, in 1 MiB
  // writes) to `fd` and syncs it: 0, or the errno that stopped it. Logs nothing and takes no
  // lock, so a rewriting child runs it too.
  static int WriteLogFile(
      int fd, const std::function<void(const std::function<void(std::string_view)>&)>& write_all);
  void EndRewrite();
  // A reservation the disk refused while a rewrite runs: the rewrite is given up (its file takes
  // room the records need); true when there was one.
  bool GiveUpRewriteForRoom();

  std::string dir_;
  std::string path_;
  int fd_ = -1;
  OpLogOptions options_;
  std::string buffer_;
  uint64_t records_ = 0;
  uint64_t file_bytes_ = 0;    // bytes in the file (flushed)
  uint64_t reserved_end_ = 0;  // the file's space is allocated up to here
  uint64_t granted_ = 0;       // bytes reserved for records not appended yet
  bool writable_ = true;
  bool needs_rewrite_ = false;
  std::string error_;
  int64_t next_retry_ns_ = 0;
  std::unique_ptr<BackgroundRewrite> rewrite_;
};

}  // namespace kvagent::master
