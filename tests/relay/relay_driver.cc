// relay_driver: a real EventRelay following a real kvmaster, for the Python tests (the agent
// binary will embed the same relay; this driver has no SDK side).
//
//   relay_driver --master-rpc E --master-events E --master-events-replay R --run-dir DIR
//                [--events-tcp E] [--page-limit N] [--idle-probe-ms N]
//
// The content comes from the master's ListKeys over its ROUTER (master.fbs), each key as
// AnnouncementFromKey makes it. Prints "READY <events> <replay> <events-tcp or ->" once the
// relay runs, then answers one command per stdin line:
//   stats  -> "STATS phase=<p> master_next_seq=<n|-> next_seq=<n> relayed=<n> repaired=<n>
//              unrepaired=<n> resets=<n> reannounces=<n> objects=<n> failures=<n>"
//   flush  -> "FLUSHED <next_seq>" once everything the relay took is out
//   keys   -> the master's key set, one "KEY <hex key> <hex session>" line each, then "END"
//   resync -> "OK"
//   stop (or end of input): stops the relay (removing its sockets) and exits 0.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "kvagent/common/flags.h"
#include "kvagent/relay/event_relay.h"
#include "kvagent/relay/relay_flags.h"
#include "zmq_test_client.h"

namespace {

using namespace kvagent;
namespace mt = kvagent::master::testing;

std::string Hex(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out.empty() ? "-" : out;
}

mt::Bytes ListKeysMsg(uint64_t cursor, uint32_t limit) {
  flatbuffers::FlatBufferBuilder b;
  return mt::Finish(b, mt::fb::Body::ListKeys, mt::fb::CreateListKeys(b, cursor, limit).Union());
}

// One ListKeys page from the master through `client`.
Result<relay::ContentPage> ListPage(mt::MasterClient& client, uint64_t cursor, uint32_t limit) {
  std::string storage;
  const mt::fb::Reply* r = client.Call(ListKeysMsg(cursor, limit), &storage);
  if (!r) return Status(ErrorCode::kMasterUnavailable, "no ListKeys reply from the master");
  if (r->status() != 0) {
    return Status(ErrorCodeFromWire(r->status()), r->message() ? r->message()->str() : "");
  }
  const mt::fb::ListKeysReply* page = r->body_as_ListKeysReply();
  if (!page) return Internal("ListKeys reply without a ListKeysReply body");
  relay::ContentPage out;
  if (page->keys()) {
    for (const mt::fb::ListedKey* k : *page->keys()) {
      out.objects.push_back(
          relay::AnnouncementFromKey(k->key() ? k->key()->string_view() : "",
                                     k->session_id() ? k->session_id()->string_view() : ""));
    }
  }
  out.next_cursor = page->next_cursor();
  out.restarted = page->restarted();
  return out;
}

void PrintStats(const relay::EventRelayStats& s) {
  std::printf(
      "STATS phase=%s master_next_seq=%s next_seq=%llu relayed=%llu repaired=%llu "
      "unrepaired=%llu resets=%llu reannounces=%llu objects=%llu failures=%llu\n",
      std::string(relay::RelayPhaseName(s.phase)).c_str(),
      s.master_next_seq ? std::to_string(*s.master_next_seq).c_str() : "-",
      static_cast<unsigned long long>(s.next_seq),
      static_cast<unsigned long long>(s.relayed_batches),
      static_cast<unsigned long long>(s.repaired_gaps),
      static_cast<unsigned long long>(s.unrepaired_gaps), static_cast<unsigned long long>(s.resets),
      static_cast<unsigned long long>(s.reannounces),
      static_cast<unsigned long long>(s.objects_reannounced),
      static_cast<unsigned long long>(s.content_failures));
}

}  // namespace

int main(int argc, char** argv) {
  std::string master_rpc;
  std::string run_dir;
  std::string events_tcp;
  uint64_t page_limit = 1000;
  uint64_t idle_probe_ms = 0;  // 0: the relay's default
  relay::EventRelayFlags relay_flags;
  FlagSet flags("relay_driver", "a real EventRelay following a real kvmaster (tests)");
  flags.String("master-rpc", &master_rpc, "the master's ROUTER (ListKeys)");
  flags.String("run-dir", &run_dir, "where events.sock and events-replay.sock go");
  flags.Uint("page-limit", &page_limit, "ListKeys page size");
  flags.Uint("idle-probe-ms", &idle_probe_ms, "how long the master may be quiet before a probe");
  relay_flags.Declare(&flags);
  if (Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 2;
  }
  auto options = relay_flags.Options(run_dir, master_rpc);
  if (!options.ok()) {
    std::fprintf(stderr, "%s\n", options.status().message().c_str());
    return 2;
  }
  if (idle_probe_ms != 0) options->idle_probe_interval = std::chrono::milliseconds(idle_probe_ms);
  // Used only by the relay thread (one thread per ZMQ socket); replaced after a failure so a
  // late reply cannot answer the next request.
  std::shared_ptr<mt::MasterClient> relay_client;
  options->list_content = [&](uint64_t cursor) -> Result<relay::ContentPage> {
    if (!relay_client) relay_client = std::make_shared<mt::MasterClient>(master_rpc, 2000);
    auto page = ListPage(*relay_client, cursor, static_cast<uint32_t>(page_limit));
    if (!page.ok()) relay_client.reset();
    return page;
  };
  auto started = relay::EventRelay::Start(std::move(*options));
  if (!started.ok()) {
    std::fprintf(stderr, "%s\n", started.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<relay::EventRelay> relay = std::move(*started);
  const auto extra = relay->extra_endpoints();
  std::printf("READY %s %s %s\n", relay->endpoint().c_str(), relay->replay_endpoint().c_str(),
              extra.empty() ? "-" : extra[0].c_str());
  std::fflush(stdout);

  mt::MasterClient main_client(master_rpc, 5000);  // this thread's own socket
  std::string command;
  while (std::getline(std::cin, command) && command != "stop") {
    if (command == "stats") {
      PrintStats(relay->stats());
    } else if (command == "flush") {
      relay->Flush();
      std::printf("FLUSHED %llu\n", static_cast<unsigned long long>(relay->stats().next_seq));
    } else if (command == "keys") {
      uint64_t cursor = 0;
      do {
        auto page = ListPage(main_client, cursor, 1000);
        if (!page.ok()) {
          std::printf("ERROR %s\n", page.status().ToString().c_str());
          break;
        }
        for (const events::BlockStored& e : page->objects) {
          std::printf("KEY %s %s\n", Hex(e.object_key.value_or("")).c_str(),
                      Hex(e.session_id.value_or("")).c_str());
        }
        cursor = page->next_cursor;
      } while (cursor != 0);
      std::printf("END\n");
    } else if (command == "resync") {
      relay->RequestResync();
      std::printf("OK\n");
    } else {
      std::printf("ERROR unknown command %s\n", command.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}
