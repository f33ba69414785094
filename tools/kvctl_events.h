// `kvctl events tail`: follow the KV events an agent publishes (docs/events.md) and print them.
//
//   kvctl [--run-dir DIR] events tail [--json] [--session ID] [--count N] [--from-seq N]
//                                     [--endpoint E --replay-endpoint R] [--timeout-ms MS]
//
// Output, one line per event (a batch of n events gives n lines with the same seq):
//   readable: "seq=42 BlockStored EXTERNAL session=sess-1 hashes=[123] parent=- tokens=4 ..."
//             (DescribeEvent), and "# ..." lines for what is not an event:
//             "# gap 17..20 not repairable", "# publisher restarted (seq 120 -> 0)",
//             "# seq 7: batch not decodable: <reason>".
//   --json:   one JSON object per line. Events: "seq", "ts", "type", then for BlockStored
//             "medium", "session_id" (only when tagged), "block_hashes", "parent_block_hash"
//             (null when absent), "token_count", "token_ids" (always the full list: a consumer
//             can drop it, but cannot get it back), "block_size", "lora_name" (null when
//             absent), "object_key" (only when set); BlockRemoved: "medium", "block_hashes",
//             "object_key" (when set). Hashes are exact decimal integers (unsigned, or
//             negative for signed ones). Non-events carry "notice" instead of "type":
//             {"notice":"gap","from":17,"to":20},
//             {"notice":"publisher_restarted","seq":0,"previous_seq":120},
//             {"notice":"undecodable","seq":7,"error":"..."}.
// Exit status: 0 after --count events (or when `stop` is set); 1 when --count was given and
// nothing arrived for --timeout-ms; 2 for a bad option (one line on the error stream).
#pragma once

#include <atomic>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include "kvagent/common/flags.h"
#include "kvagent/events/kv_event.h"

namespace kvagent::kvctl {

struct EventsTailOptions {
  std::string run_dir = "/run/kvagent";  // kvctl's --run-dir: where the default sockets are
  std::string endpoint;                  // --endpoint; default ipc://<run_dir>/events.sock
  std::string replay_endpoint;      // --replay-endpoint; default (with the default endpoint only)
                                    // ipc://<run_dir>/events-replay.sock; none: gaps not repaired
  bool json = false;                // --json
  std::string session;              // --session: only BlockStored events of this session
  uint64_t count = 0;               // --count: exit after this many events; 0: never
  int64_t from_seq = -1;            // replay from this seq first; -1: live only
  std::string from_seq_flag;        // --from-seq as given: a seq (0 or more) or empty (live only)
  int64_t timeout_ms = 10000;       // --timeout-ms: with --count, give up after this silence
  std::string cluster_secret_file;  // --cluster-secret-file: CURVE for tcp:// endpoints
  const std::atomic<bool>* stop = nullptr;  // when set and true, return 0 (checked each 100 ms)

  // Declares the subcommand's flags (all of the above but run_dir, which is kvctl's) on
  // `flags`. `this` must outlive flags->Parse().
  void Declare(FlagSet* flags);
};

// Runs `events tail` with `options`: events to `out` (flushed per batch), a one-line reason to
// `err` on failure. Returns the exit status (see the top of this file).
int RunEventsTail(const EventsTailOptions& options, std::ostream& out, std::ostream& err);

// The whole subcommand: argv[0] is "tail", argv[1..] its flags. --help prints the usage to
// `out` and returns 0; a bad flag prints one line to `err` and returns 2; otherwise runs.
int EventsTailMain(int argc, char** argv, const std::string& run_dir, std::ostream& out,
                   std::ostream& err);

// One output line (without the newline), as described at the top of this file.
std::string EventLine(uint64_t seq, const events::KvEvent& event);
std::string EventJson(uint64_t seq, double ts, const events::KvEvent& event);

// `text` as a JSON string literal: quotes, backslash and control characters escaped; other
// bytes (valid UTF-8 from the strict decoder) copied.
std::string JsonString(std::string_view text);

}  // namespace kvagent::kvctl
