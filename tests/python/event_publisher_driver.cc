// event_publisher_driver: a real EventPublisher driven over stdin, for the Python tests.
//
//   event_publisher_driver --endpoint E --replay-endpoint R [--topic T]
//
// Binds, then prints "ENDPOINT <bound PUB endpoint>" and "REPLAY <bound ROUTER endpoint>".
// Then reads commands, one per line, and answers each with one line:
//   probe    publishes one AllBlocksCleared batch          -> "PUBLISHED <next_seq> <events>"
//   publish  publishes the scripted events (several batches) -> "PUBLISHED <next_seq> <events>"
//   stats    -> "STATS <next_seq> <published_events> <dropped_events> <replay_requests>"
//   stop (or end of input) exits 0 after closing the sockets.
// The replay ROUTER is served the whole time. The script is mirrored in test_strict_events.py
// (SCRIPTED_SESSIONS etc.): change both together.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "kvagent/events/event_publisher.h"
#include "kvagent/events/kv_event.h"

namespace {

using namespace kvagent::events;

// Session IDs on the scripted BlockStored events: ASCII, accented Latin, CJK, emoji, and one of
// exactly 256 bytes (the limit) made of 2-byte characters.
std::vector<std::string> ScriptedSessions() {
  std::string max_len;
  while (max_len.size() < 256) max_len += "é";  // 2 bytes each: 128 of them
  return {"sess-1", "sessão-β", "会话-7", "run-🚀", max_len};
}

BlockStored Stored(std::vector<BlockHash> hashes, uint32_t block_size, uint32_t first_token) {
  BlockStored e;
  e.block_hashes = std::move(hashes);
  e.block_size = block_size;
  for (uint32_t i = 0; i < block_size * e.block_hashes.size(); ++i) {
    e.token_ids.push_back(first_token + i);
  }
  return e;
}

// Five batches covering every event type and optional field, then a burst of 1500 events that
// the publisher splits by max_batch_events.
std::vector<std::vector<KvEvent>> Script() {
  std::vector<std::vector<KvEvent>> batches;
  const auto sessions = ScriptedSessions();

  std::vector<KvEvent> tagged;
  for (size_t i = 0; i < sessions.size(); ++i) {
    BlockStored e = Stored({BlockHash::Unsigned(1000 + i)}, 4, static_cast<uint32_t>(10 * i));
    e.session_id = sessions[i];
    tagged.push_back(e);
  }
  batches.push_back(tagged);

  // Hashes from keys (docs/events.md): SHA-256 hex -> signed, decimal/0x -> unsigned, other -> [].
  const std::string digest = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  BlockStored from_digest = Stored({*BlockHashFromKey(digest)}, 2, 7);
  from_digest.parent_block_hash = BlockHash::Signed(-42);
  from_digest.session_id = "sess-1";
  BlockStored from_hex = Stored({*BlockHashFromKey("0xffffffffffffffff")}, 1, 4294967295u);
  from_hex.medium = std::string(kMediumDisk);
  from_hex.group_idx = 0;
  BlockStored keyed = Stored({}, 16, 0);  // no hash derivable: the key travels
  keyed.object_key = "model/llama/layer-0/ключ";
  keyed.lora_name = "adapter-ü";
  keyed.lora_id = 3;
  batches.push_back({from_digest, from_hex, keyed});

  BlockRemoved removed;
  removed.block_hashes = {BlockHash::Unsigned(1000), BlockHash::Signed(-5)};
  BlockRemoved removed_key;
  removed_key.medium = std::string(kMediumDisk);
  removed_key.object_key = "model/llama/layer-0/ключ";
  batches.push_back({removed, removed_key});
  batches.push_back({AllBlocksCleared{}});
  batches.push_back({Stored({BlockHash::Unsigned(7)}, 0, 0)});  // block_size 0, no tokens

  std::vector<KvEvent> burst;
  for (uint32_t i = 0; i < 1500; ++i) {
    BlockStored e = Stored({BlockHash::Unsigned((1u << 20) | i)}, 16, i);
    e.session_id = sessions[i % sessions.size()];
    burst.push_back(e);
  }
  batches.push_back(std::move(burst));
  return batches;
}

void Reply(EventPublisher& publisher, const char* what, size_t events) {
  const EventPublisherStats s = publisher.stats();
  std::printf("%s %llu %zu\n", what, static_cast<unsigned long long>(s.next_seq), events);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  EventPublisherOptions options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--endpoint") {
      options.endpoint = argv[i + 1];
    } else if (flag == "--replay-endpoint") {
      options.replay_endpoint = argv[i + 1];
    } else if (flag == "--topic") {
      options.topic = argv[i + 1];
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  auto started = EventPublisher::Start(options);
  if (!started.ok()) {
    std::fprintf(stderr, "%s\n", started.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<EventPublisher> publisher = std::move(*started);
  std::printf("ENDPOINT %s\nREPLAY %s\n", publisher->endpoint().c_str(),
              publisher->replay_endpoint().c_str());
  std::fflush(stdout);

  std::string command;
  while (std::getline(std::cin, command) && command != "stop") {
    if (command == "probe") {
      publisher->Publish(AllBlocksCleared{});
      publisher->Flush();
      Reply(*publisher, "PUBLISHED", 1);
    } else if (command == "publish") {
      size_t events = 0;
      for (auto& batch : Script()) {
        events += batch.size();
        publisher->Publish(std::move(batch));
        publisher->Flush();  // keeps the scripted batches apart
      }
      Reply(*publisher, "PUBLISHED", events);
    } else if (command == "stats") {
      const EventPublisherStats s = publisher->stats();
      std::printf("STATS %llu %llu %llu %llu\n", static_cast<unsigned long long>(s.next_seq),
                  static_cast<unsigned long long>(s.published_events),
                  static_cast<unsigned long long>(s.dropped_events),
                  static_cast<unsigned long long>(s.replay_requests));
      std::fflush(stdout);
    } else {
      std::printf("ERROR unknown command %s\n", command.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
