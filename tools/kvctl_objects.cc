// kvctl put / get / rm / ls: one object at a time through the SDK, for people and scripts.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>

#include "kvagent/common/errno_text.h"
#include "kvctl_agent.h"
#include "kvctl_commands.h"

namespace kvagent::kvctl {
namespace {

constexpr CommandSpec kPut{
    "put",
    "put KEY (--value STR | --file PATH) [--session ID] [--replicas N] [--hard-pin] "
    "[--soft-pin-ttl-ms N] [--max-stream-bytes N]",
    "Stores one value under KEY. A key that is already stored keeps its value and its session:\n"
    "put prints \"KEY exists\" and exits 0 (the store treats a duplicate put as success; values\n"
    "are immutable). --file - reads the value from standard input; standard input, pipes and\n"
    "devices are read up to --max-stream-bytes (1 GiB, the agent's default arena cap).",
    1, 1};
constexpr CommandSpec kGet{
    "get", "get KEY [--out PATH]",
    "Writes the value stored under KEY to standard output (the bytes, nothing else), or to PATH.",
    1, 1};
constexpr CommandSpec kRm{"rm", "rm KEY [--force]",
                          "Removes KEY. A key some reader holds a lease on is refused unless "
                          "--force is given.",
                          1, 1};
constexpr CommandSpec kLs{
    "ls", "ls [--prefix P] [--limit N]",
    "Lists stored keys, one per line: KEY<TAB>SIZE<TAB>SESSION (\"-\" when untagged), in the\n"
    "store's scan order (pipe to sort for an order). Control bytes and backslashes in keys are\n"
    "printed as \\xNN.",
    0, 0};

// Arena bytes to ask for so that a value of `bytes` fits with room for the allocator's
// rounding: the value plus 1 MiB, at least 4 MiB.
uint64_t ArenaFor(uint64_t bytes) { return std::max<uint64_t>(bytes + (1 << 20), 4 << 20); }

// A buffer of `bytes` in `client`'s arena, with a message that says what to raise when the
// agent granted too small an arena.
Result<ArenaBuffer> AllocateValue(Client& client, uint64_t bytes) {
  if (bytes > client.arena_bytes()) {
    return Status(ErrorCode::kNoSpace, "the value is " + std::to_string(bytes) +
                                           " bytes but the agent grants kvctl " +
                                           std::to_string(client.arena_bytes()) +
                                           " bytes of arena; raise kvagent --max-arena-bytes");
  }
  return client.Allocate(bytes);
}

// Reads all of `in` into `out`, refusing a stream longer than `max_bytes` (a device such as
// /dev/zero never ends) once it has read one byte more.
Status ReadAll(std::istream& in, const std::string& name, uint64_t max_bytes, std::string* out) {
  constexpr size_t kChunk = 1 << 20;
  out->clear();
  while (in) {
    const size_t have = out->size();
    const uint64_t rest = max_bytes - have;  // have <= max_bytes here
    const size_t want = rest >= kChunk ? kChunk : static_cast<size_t>(rest) + 1;
    out->resize(have + want);
    in.read(out->data() + have, static_cast<std::streamsize>(want));
    out->resize(have + static_cast<size_t>(in.gcount()));
    if (out->size() > max_bytes) {
      out->clear();
      return InvalidParams(name + " holds more than " + std::to_string(max_bytes) +
                           " bytes; raise --max-stream-bytes (and the agent's "
                           "--max-arena-bytes) for a larger value");
    }
  }
  if (in.bad()) return InvalidParams("cannot read " + name + ": " + ErrnoText(errno));
  return Status::Ok();
}

// Bytes of `path` when it is a regular file (its size is known before reading), else nullopt.
std::optional<uint64_t> RegularFileSize(const std::string& path) {
  std::error_code ec;
  if (path == "-" || !std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return std::nullopt;
  return size;
}

// Standard input ("-"), a pipe, a FIFO or a device: read whole, since the size is only known
// once read.
Status ReadStream(const std::string& path, uint64_t max_bytes, std::string* out) {
  if (path == "-") return ReadAll(std::cin, "standard input", max_bytes, out);
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidParams("cannot open " + path + ": " + ErrnoText(errno));
  return ReadAll(in, path, max_bytes, out);
}

// The value of `put` in an arena buffer of `client`: `value` (--value, or a stream read
// beforehand), or a regular file at `path`, read straight into the arena (no intermediate copy).
Result<ArenaBuffer> LoadValue(Client& client, const std::string& value, bool from_file,
                              const std::string& path) {
  if (from_file) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return InvalidParams("cannot open " + path + ": " + ErrnoText(errno));
    const uint64_t size = RegularFileSize(path).value_or(0);
    if (size == 0) return InvalidParams(path + " is empty; a value needs at least 1 byte");
    auto buffer = AllocateValue(client, size);
    if (!buffer.ok()) return buffer.status();
    in.read(reinterpret_cast<char*>(buffer->data()), static_cast<std::streamsize>(size));
    if (static_cast<uint64_t>(in.gcount()) != size) {
      return InvalidParams("cannot read " + path + ": it became shorter while read");
    }
    return buffer;
  }
  if (value.empty()) return InvalidParams("the value is empty; a value needs at least 1 byte");
  auto buffer = AllocateValue(client, value.size());
  if (!buffer.ok()) return buffer.status();
  std::memcpy(buffer->data(), value.data(), value.size());
  return buffer;
}

// Size of the value `put` will store, to size the arena before connecting (0 when unknown:
// standard input or a non-regular file).
uint64_t ValueSizeHint(const std::string& value, bool from_file, const std::string& path) {
  if (!from_file) return value.size();
  return RegularFileSize(path).value_or(0);
}

}  // namespace

int PutCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
               std::ostream& err) {
  std::string value, file, session;
  int64_t replicas = 1, soft_pin_ttl_ms = -1;
  bool hard_pin = false;
  uint64_t max_stream_bytes = 1ULL << 30;
  FlagSet flags("kvctl put", std::string(kPut.summary));
  flags.String("value", &value, "the value, as given (at least 1 byte)");
  flags.String("file", &file, "read the value from this file (- for standard input)");
  flags.String("session", &session, "the session that writes the value (UTF-8, <= 256 bytes)");
  flags.Int("replicas", &replicas, "replicas on distinct agents (1..255)");
  flags.Bool("hard-pin", &hard_pin, "never evict the value");
  flags.Int("soft-pin-ttl-ms", &soft_pin_ttl_ms,
            "evict the value only after unpinned ones, for this long (0: the master's default); "
            "-1: no soft pin");
  flags.Size("max-stream-bytes", &max_stream_bytes,
             "the most bytes read from standard input, a pipe or a device (1 GiB)");
  std::vector<std::string> positionals;
  if (auto exit = ParseCommandLine(kPut, &flags, argc, argv, &positionals, out, err)) return *exit;
  const std::string& key = positionals[0];
  // --value "" is a value (an empty one, refused below with a reason), so presence is what
  // counts, not emptiness.
  bool has_value = false, has_file = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    has_value |= a == "--value" || a.rfind("--value=", 0) == 0;
    has_file |= a == "--file" || a.rfind("--file=", 0) == 0;
  }
  if (has_value == has_file) return ReportUsage(err, kPut, "give exactly one of --value, --file");
  if (replicas < 1 || replicas > 255) {
    return ReportUsage(err, kPut, "--replicas must be 1..255");
  }
  if (soft_pin_ttl_ms < -1 || soft_pin_ttl_ms > std::numeric_limits<uint32_t>::max()) {
    return ReportUsage(err, kPut, "--soft-pin-ttl-ms must be -1 (none), 0 or a duration in ms");
  }
  if (max_stream_bytes == 0) return ReportUsage(err, kPut, "--max-stream-bytes must be at least 1");
  const std::string what = "put " + key;

  // Standard input, pipes and devices are read before connecting, so that the arena asked for
  // fits the value whatever its size (only a regular file's size is known beforehand).
  std::optional<std::string> streamed;
  if (has_file && !RegularFileSize(file)) {
    streamed.emplace();
    if (Status st = ReadStream(file, max_stream_bytes, &*streamed); !st.ok())
      return ReportFailure(err, what, st);
  }
  const uint64_t size_hint = streamed ? streamed->size() : ValueSizeHint(value, has_file, file);
  auto client = ConnectAgent(global, ArenaFor(size_hint));
  if (!client.ok()) return ReportFailure(err, what, client.status());
  auto buffer = streamed ? LoadValue(**client, *streamed, false, "")
                         : LoadValue(**client, value, has_file, file);
  if (!buffer.ok()) return ReportFailure(err, what, buffer.status());

  CallOptions call = CallWithTimeout(global);
  std::vector<std::string> keys = {key};
  std::vector<std::string> sessions = {session};
  if (!session.empty()) call.session_ids = sessions;
  call.write.replica_count = static_cast<uint8_t>(replicas);
  call.write.hard_pin = hard_pin;
  call.write.soft_pin = soft_pin_ttl_ms >= 0;
  call.write.soft_pin_ttl_ms = soft_pin_ttl_ms > 0 ? static_cast<uint32_t>(soft_pin_ttl_ms) : 0;
  std::vector<Value> values = {Value(*buffer)};
  Reply reply = (*client)->Put(keys, values, call);
  if (Status st = FirstFailure(reply); !st.ok()) return ReportFailure(err, what, st);
  if (reply.keys.at(0).code == ErrorCode::kObjectAlreadyExists) {
    out << PrintableKey(key) << " exists (kept as it was; a put never replaces a value)\n";
  } else {
    out << "stored " << PrintableKey(key) << " (" << buffer->size() << " bytes"
        << (session.empty() ? "" : ", session " + session) << ")\n";
  }
  return kExitOk;
}

int GetCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
               std::ostream& err) {
  std::string out_path;
  FlagSet flags("kvctl get", std::string(kGet.summary));
  flags.String("out", &out_path, "write the value to this file instead of standard output");
  std::vector<std::string> positionals;
  if (auto exit = ParseCommandLine(kGet, &flags, argc, argv, &positionals, out, err)) return *exit;
  const std::string& key = positionals[0];
  const std::string what = "get " + key;

  // Most values fit the first buffer; a larger one is reported with its length
  // (BUFFER_OUT_OF_RANGE) and read again into a buffer of exactly that size, in a larger arena
  // when needed. A few rounds cover a value upserted to a larger size in between.
  uint64_t capacity = 1 << 20;
  std::unique_ptr<Client> client;
  std::vector<std::string> keys = {key};
  for (int round = 0; round < 4; ++round) {
    if (client == nullptr || ArenaFor(capacity) > client->arena_bytes()) {
      client.reset();
      auto connected = ConnectAgent(global, ArenaFor(capacity));
      if (!connected.ok()) return ReportFailure(err, what, connected.status());
      client = std::move(*connected);
    }
    auto buffer = AllocateValue(*client, capacity);
    if (!buffer.ok()) return ReportFailure(err, what, buffer.status());
    std::vector<const ArenaBuffer*> targets = {&*buffer};
    Reply reply = client->Get(keys, targets, CallWithTimeout(global));
    if (!reply.ok()) return ReportFailure(err, what, reply.status);
    const KeyResult& result = reply.keys.at(0);
    if (result.code == ErrorCode::kBufferOutOfRange && result.length > capacity) {
      capacity = result.length;
      continue;
    }
    if (result.code != ErrorCode::kOk) {
      return ReportFailure(err, what, Status(result.code, result.message));
    }
    const char* bytes = reinterpret_cast<const char*>(buffer->data());
    if (out_path.empty()) {
      out.write(bytes, static_cast<std::streamsize>(result.length));
      out.flush();
      if (!out) return ReportFailure(err, what, Internal("cannot write to standard output"));
      return kExitOk;
    }
    std::ofstream file(out_path, std::ios::binary | std::ios::trunc);
    file.write(bytes, static_cast<std::streamsize>(result.length));
    file.close();
    if (!file) {
      return ReportFailure(err, what,
                           InvalidParams("cannot write " + out_path + ": " + ErrnoText(errno)));
    }
    out << "wrote " << result.length << " bytes to " << out_path << "\n";
    return kExitOk;
  }
  return ReportFailure(err, what,
                       Status(ErrorCode::kObjectBusy,
                              "the value kept growing while it was read (it is being upserted); "
                              "retry"));
}

int RmCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
              std::ostream& err) {
  bool force = false;
  FlagSet flags("kvctl rm", std::string(kRm.summary));
  flags.Bool("force", &force, "remove even when a reader holds a lease on the key");
  std::vector<std::string> positionals;
  if (auto exit = ParseCommandLine(kRm, &flags, argc, argv, &positionals, out, err)) return *exit;
  const std::string& key = positionals[0];
  const std::string what = "rm " + key;
  auto client = ConnectAgent(global, 1 << 20);
  if (!client.ok()) return ReportFailure(err, what, client.status());
  CallOptions call = CallWithTimeout(global);
  call.force = force;
  std::vector<std::string> keys = {key};
  Reply reply = (*client)->Remove(keys, call);
  if (Status st = FirstFailure(reply); !st.ok()) {
    if (st.code() == ErrorCode::kObjectHasLease) {
      st = Status(st.code(), st.message() + " (kvctl rm --force removes it now)");
    }
    return ReportFailure(err, what, st);
  }
  out << "removed " << PrintableKey(key) << "\n";
  return kExitOk;
}

int LsCommand(const GlobalOptions& global, int argc, char** argv, std::ostream& out,
              std::ostream& err) {
  std::string prefix;
  int64_t limit = 0;
  FlagSet flags("kvctl ls", std::string(kLs.summary));
  flags.String("prefix", &prefix, "only keys that start with P");
  flags.Int("limit", &limit, "print at most N keys (0: all)");
  std::vector<std::string> positionals;
  if (auto exit = ParseCommandLine(kLs, &flags, argc, argv, &positionals, out, err)) return *exit;
  if (limit < 0) return ReportUsage(err, kLs, "--limit must be >= 0");
  auto client = ConnectAgent(global, 1 << 20);
  if (!client.ok()) return ReportFailure(err, "ls", client.status());

  ListOptions list;
  list.prefix = prefix;
  list.timeout = global.timeout;
  uint64_t printed = 0;
  // Pages until the scan ends (next_cursor 0) or --limit keys are out; a page may be empty
  // before the end, so only the cursor decides.
  for (;;) {
    if (limit > 0) {
      list.limit = static_cast<uint32_t>(std::min<uint64_t>(limit - printed, 1000));
    }
    Reply page = (*client)->List(list);
    if (!page.ok()) return ReportFailure(err, "ls", page.status);
    for (const ListedKey& k : page.listed) {
      if (limit > 0 && printed == static_cast<uint64_t>(limit)) break;
      out << PrintableKey(k.key) << '\t' << k.size << '\t'
          << (k.session_id.empty() ? "-" : k.session_id) << '\n';
      ++printed;
    }
    if (page.next_cursor == 0 || (limit > 0 && printed == static_cast<uint64_t>(limit))) break;
    list.cursor = page.next_cursor;
  }
  out.flush();
  return kExitOk;
}

std::string PrintableKey(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (const char c : key) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f || c == '\\') {
      char escaped[5];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace kvagent::kvctl
