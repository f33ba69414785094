#include "result.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvagent::c_abi {
namespace {

// What a kv_result_t points into; reached through kv_result_t::internal. The per-key messages
// are the reply's own strings (no copy), so `reply` is never modified after MakeResult.
struct ResultStorage {
  kv_result_t result{};
  Reply reply;
  std::vector<kv_key_result_t> keys;
  std::vector<kv_listed_key_t> listed;
  std::vector<kv_counter_t> counters;
};

kv_bytes_t View(const std::string& s) { return kv_bytes_t{s.data(), s.size()}; }

// List's page and Stat's counters, pointing into the reply's strings.
void FillListAndCounters(ResultStorage& storage) {
  const Reply& r = storage.reply;
  storage.listed.reserve(r.listed.size());
  for (const ListedKey& k : r.listed) {
    storage.listed.push_back(kv_listed_key_t{View(k.key), k.size, View(k.session_id)});
  }
  storage.counters.reserve(r.counters.size());
  for (const Counter& c : r.counters) {
    storage.counters.push_back(
        kv_counter_t{c.name.c_str(), c.name.size(), c.value, c.text.c_str(), c.text.size()});
  }
  kv_result_t& out = storage.result;
  out.listed = storage.listed.data();
  out.listed_count = storage.listed.size();
  out.next_cursor = r.next_cursor;
  out.counters = storage.counters.data();
  out.counter_count = storage.counters.size();
}

}  // namespace

kv_result_t* MakeResult(Reply reply) {
  auto storage = std::make_unique<ResultStorage>();
  storage->reply = std::move(reply);
  const Reply& r = storage->reply;
  storage->keys.resize(r.keys.size());
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const KeyResult& from = r.keys[i];
    kv_key_result_t& to = storage->keys[i];
    to.code = static_cast<kv_status_t>(from.code);
    to.exists = from.exists ? 1 : 0;
    to.length = from.length;
    to.message = from.message.c_str();
    to.message_size = from.message.size();
    to.replicas = from.replicas;
  }
  kv_result_t& out = storage->result;
  out.status = static_cast<kv_status_t>(r.status.code());
  out.message = r.status.message().c_str();
  out.message_size = r.status.message().size();
  out.keys = storage->keys.data();
  out.key_count = storage->keys.size();
  out.removed_count = r.removed_count;
  FillListAndCounters(*storage);
  out.internal = storage.get();
  return &storage.release()->result;
}

}  // namespace kvagent::c_abi

extern "C" void kv_result_free(kv_result_t* result) {
  if (result == nullptr) return;
  delete static_cast<kvagent::c_abi::ResultStorage*>(result->internal);
}
