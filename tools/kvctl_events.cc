#include "kvctl_events.h"

#include <sys/stat.h>
#include <unistd.h>
#include <charconv>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <optional>
#include <variant>
#include <vector>

#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/validate.h"
#include "kvagent/events/event_subscriber.h"

namespace kvagent::kvctl {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kStopCheck = 100ms;

std::string HashText(const events::BlockHash& h) {
  return h.is_signed ? std::to_string(static_cast<int64_t>(h.bits)) : std::to_string(h.bits);
}

// Appends `"key":`.
void Key(std::string* out, std::string_view key) {
  out->push_back(',');
  out->append(JsonString(key));
  out->push_back(':');
}

void Hashes(std::string* out, const std::vector<events::BlockHash>& hashes) {
  Key(out, "block_hashes");
  out->push_back('[');
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (i > 0) out->push_back(',');
    out->append(HashText(hashes[i]));
  }
  out->push_back(']');
}

void OptionalText(std::string* out, std::string_view key, const std::optional<std::string>& v,
                  bool null_when_absent) {
  if (!v && !null_when_absent) return;
  Key(out, key);
  out->append(v ? JsonString(*v) : "null");
}

std::string JsonStored(const events::BlockStored& e) {
  std::string out;
  Key(&out, "medium");
  out += JsonString(e.medium);
  if (e.session_id && !e.session_id->empty()) OptionalText(&out, "session_id", e.session_id, false);
  Hashes(&out, e.block_hashes);
  Key(&out, "parent_block_hash");
  out += e.parent_block_hash ? HashText(*e.parent_block_hash) : "null";
  Key(&out, "token_count");
  out += std::to_string(e.token_ids.size());
  Key(&out, "token_ids");
  out.push_back('[');
  for (size_t i = 0; i < e.token_ids.size(); ++i) {
    if (i > 0) out.push_back(',');
    out += std::to_string(e.token_ids[i]);
  }
  out.push_back(']');
  Key(&out, "block_size");
  out += std::to_string(e.block_size);
  OptionalText(&out, "lora_name", e.lora_name, true);
  OptionalText(&out, "object_key", e.object_key, false);
  return out;
}

std::string JsonRemoved(const events::BlockRemoved& e) {
  std::string out;
  Key(&out, "medium");
  out += JsonString(e.medium);
  Hashes(&out, e.block_hashes);
  OptionalText(&out, "object_key", e.object_key, false);
  return out;
}

std::string_view TypeName(const events::KvEvent& e) {
  if (std::holds_alternative<events::BlockStored>(e)) return "BlockStored";
  if (std::holds_alternative<events::BlockRemoved>(e)) return "BlockRemoved";
  return "AllBlocksCleared";
}

bool Matches(const events::KvEvent& e, const std::string& session) {
  if (session.empty()) return true;
  const auto* stored = std::get_if<events::BlockStored>(&e);
  return stored && stored->session_id == session;
}

// Checks the options and fills in the default endpoints; "" or the one-line reason.
std::string Resolve(EventsTailOptions* o) {
  if (Status s = ValidateSessionId(o->session, "--session"); !s.ok()) {
    return "refused session ID: " + s.message();
  }
  if (!o->from_seq_flag.empty()) {
    const std::string& text = o->from_seq_flag;
    int64_t seq = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), seq);
    // Digits only (from_chars takes a leading '-'), and within int64 (9999999999999999999 is
    // 19 digits and out of range: it once reached std::stoll, which threw).
    if (text.empty() || text[0] == '-' || error != std::errc() ||
        end != text.data() + text.size()) {
      return "--from-seq " + text +
             " is not a seq: give 0 or more, up to 2^63 - 1 (leave it out to follow live only)";
    }
    o->from_seq = seq;
  }
  if (o->from_seq < -1) return "--from-seq must be a seq (0 or more), or -1 for live only";
  if (o->timeout_ms < 0) return "--timeout-ms must be 0 (wait forever) or more";
  if (o->endpoint.empty()) {
    if (o->run_dir.empty()) return "no --endpoint and no --run-dir: set one";
    o->endpoint = "ipc://" + o->run_dir + "/events.sock";
    if (o->replay_endpoint.empty())
      o->replay_endpoint = "ipc://" + o->run_dir + "/events-replay.sock";
  }
  if (o->from_seq >= 0 && o->replay_endpoint.empty()) {
    return "--from-seq needs the publisher's replay socket: set --replay-endpoint";
  }
  return "";
}

// The socket file of an ipc:// endpoint; "" for any other transport.
std::string IpcPath(const std::string& endpoint) {
  constexpr std::string_view kIpc = "ipc://";
  return endpoint.rfind(kIpc, 0) == 0 ? endpoint.substr(kIpc.size()) : "";
}

// "" when this process may connect to `endpoint`, else why not. ZMQ would retry an ipc
// connect that the file's permissions refuse forever and silently: the tail then looked like
// a publisher with no events.
std::string CheckIpcAccess(const std::string& endpoint) {
  const std::string path = IpcPath(endpoint);
  if (path.empty()) return "";
  if (::access(path.c_str(), W_OK) == 0 || errno != EACCES) return "";
  struct stat st {};
  std::string who;
  if (::stat(path.c_str(), &st) == 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    who = " (mode " + std::string(mode) + ", uid " + std::to_string(st.st_uid) + ", gid " +
          std::to_string(st.st_gid) + ")";
  }
  return "permission denied on " + path + who +
         ": connecting needs write access; run as its owner, root or a member of its group, or "
         "start kvagent with --events-group GROUP";
}

// A note for an ipc endpoint whose socket file does not exist ("" when it does, or for tcp://):
// the tail then waits for a publisher to appear, which a mistyped --run-dir makes look like an
// agent with no events.
std::string NoteMissingIpc(const EventsTailOptions& o) {
  const std::string path = IpcPath(o.endpoint);
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) == 0 || errno != ENOENT) return "";
  std::string note = "nothing listens on " + path + " yet (no such socket); waiting for it";
  if (o.endpoint == "ipc://" + o.run_dir + "/events.sock") {
    note += " (is kvagent running with --run-dir " + o.run_dir + "?)";
  }
  return note;
}

// Prints one delivery; returns how many events it printed.
uint64_t Print(const events::EventDelivery& d, const EventsTailOptions& o, uint64_t budget,
               std::ostream& out) {
  using Kind = events::EventDelivery::Kind;
  if (d.kind == Kind::kGap) {
    if (o.json) {
      out << "{\"notice\":\"gap\",\"from\":" << d.seq << ",\"to\":" << d.gap_to << "}\n";
    } else {
      out << "# gap " << d.seq << ".." << d.gap_to << " not repairable\n";
    }
    return 0;
  }
  if (d.kind == Kind::kReset) {
    if (o.json) {
      out << "{\"notice\":\"publisher_restarted\",\"seq\":" << d.seq
          << ",\"previous_seq\":" << d.previous_seq << "}\n";
    } else {
      out << "# publisher restarted (seq " << d.previous_seq << " -> " << d.seq << ")\n";
    }
    return 0;
  }
  if (!d.batch) {
    if (o.json) {
      out << "{\"notice\":\"undecodable\",\"seq\":" << d.seq
          << ",\"error\":" << JsonString(d.decode_status.message()) << "}\n";
    } else {
      out << "# seq " << d.seq << ": batch not decodable: " << d.decode_status.message() << "\n";
    }
    return 0;
  }
  uint64_t printed = 0;
  for (const events::KvEvent& e : d.batch->events) {
    if (budget != 0 && printed == budget) break;
    if (!Matches(e, o.session)) continue;
    out << (o.json ? EventJson(d.seq, d.batch->ts, e) : EventLine(d.seq, e)) << '\n';
    ++printed;
  }
  return printed;
}

}  // namespace

std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

std::string EventLine(uint64_t seq, const events::KvEvent& event) {
  return "seq=" + std::to_string(seq) + " " + events::DescribeEvent(event);
}

std::string EventJson(uint64_t seq, double ts, const events::KvEvent& event) {
  char ts_text[32];
  std::snprintf(ts_text, sizeof ts_text, "%.6f", ts);
  std::string out = "{\"seq\":" + std::to_string(seq) + ",\"ts\":" + ts_text;
  Key(&out, "type");
  out += JsonString(TypeName(event));
  if (const auto* stored = std::get_if<events::BlockStored>(&event)) out += JsonStored(*stored);
  if (const auto* removed = std::get_if<events::BlockRemoved>(&event)) out += JsonRemoved(*removed);
  out.push_back('}');
  return out;
}

void EventsTailOptions::Declare(FlagSet* flags) {
  flags->Bool("json", &json, "one JSON object per line instead of readable text");
  flags->String("session", &session,
                "show only BlockStored events written by this session ID (removals and clears "
                "carry no session and are hidden too)");
  flags->Uint("count", &count, "exit after this many events (0: run until interrupted)");
  flags->String("from-seq", &from_seq_flag,
                "first replay the retained batches from this seq (0 or more), then follow live "
                "(default: live only)");
  flags->String("endpoint", &endpoint,
                "the PUB endpoint to follow (default: ipc://<run-dir>/events.sock)");
  flags->String("replay-endpoint", &replay_endpoint,
                "its replay ROUTER, to repair gaps and for --from-seq (default with the default "
                "endpoint: ipc://<run-dir>/events-replay.sock)");
  flags->Int("timeout-ms", &timeout_ms,
             "with --count: exit 1 when no batch arrives for this long (0: wait forever)");
  flags->String("cluster-secret-file", &cluster_secret_file,
                "the cluster secret, to follow a tcp:// publisher of a cluster that has one "
                "(kvmaster, or an agent's --events-tcp)");
}

int RunEventsTail(const EventsTailOptions& options, std::ostream& out, std::ostream& err) {
  EventsTailOptions o = options;
  if (std::string reason = Resolve(&o); !reason.empty()) {
    err << "kvctl events tail: " << reason << "\n";
    return 2;
  }
  for (const std::string* endpoint : {&o.endpoint, &o.replay_endpoint}) {
    if (std::string denied = CheckIpcAccess(*endpoint); !denied.empty()) {
      err << "kvctl events tail: " << denied << "\n";
      return 1;
    }
  }
  if (std::string note = NoteMissingIpc(o); !note.empty()) {
    err << "kvctl events tail: " << note << "\n";
  }
  events::EventSubscriberOptions so;
  so.endpoint = o.endpoint;
  so.replay_endpoint = o.replay_endpoint;
  if (o.from_seq >= 0) so.from_seq = static_cast<uint64_t>(o.from_seq);
  so.decode = true;
  if (!o.cluster_secret_file.empty()) {
    Result<ClusterSecret> secret = ClusterSecret::LoadFromFile(o.cluster_secret_file);
    if (!secret.ok()) {
      err << "kvctl events tail: " << secret.status().message() << "\n";
      return 2;
    }
    so.curve = secret->CurveKeys(KeyPlane::kEvents);
  }
  auto sub = events::EventSubscriber::Start(so);
  if (!sub.ok()) {
    err << "kvctl events tail: " << sub.status().message() << "\n";
    return 2;
  }
  const bool bounded = o.count > 0 && o.timeout_ms > 0;
  const auto silence = std::chrono::milliseconds(o.timeout_ms);
  Clock::time_point last_heard = Clock::now();
  uint64_t printed = 0;
  while (o.count == 0 || printed < o.count) {
    if (o.stop && o.stop->load()) return 0;
    Result<events::EventDelivery> d = (*sub)->Next(kStopCheck);
    if (!d.ok()) {
      if (bounded && Clock::now() - last_heard >= silence) {
        err << "kvctl events tail: no events from " << o.endpoint << " within " << o.timeout_ms
            << " ms (" << printed << " of " << o.count << " printed)\n";
        return 1;
      }
      continue;
    }
    last_heard = Clock::now();
    printed += Print(*d, o, o.count == 0 ? 0 : o.count - printed, out);
    out.flush();
  }
  return 0;
}

int EventsTailMain(int argc, char** argv, const std::string& run_dir, std::ostream& out,
                   std::ostream& err) {
  EventsTailOptions options;
  options.run_dir = run_dir;
  FlagSet flags("kvctl events tail",
                "follow the KV events an agent publishes, one line per event (seq, type, medium, "
                "session, hashes/key)");
  options.Declare(&flags);
  if (Status parsed = flags.Parse(argc, argv); !parsed.ok()) {
    err << "kvctl events tail: " << parsed.message() << "\n";
    return 2;
  }
  if (flags.help_requested()) {
    out << flags.Usage();
    return 0;
  }
  return RunEventsTail(options, out, err);
}

}  // namespace kvagent::kvctl
