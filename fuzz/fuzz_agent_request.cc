// The agent's check of a ring request (agent/src/request_check.cc): any bytes a client can put
// on its request ring. Must never crash, read out of bounds, hit UB or allocate without bound;
// a request it accepts must be safe to read field by field as the pipeline does.
#include <glog/logging.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "request_check.h"

// The code under test logs refusals; millions of runs must not print them.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The ring service copies a frame into private (malloc-aligned) memory before checking it.
  std::vector<uint8_t> frame(data, data + size);
  const uint64_t request_id = size >= 8 ? 42 : 0;
  kvagent::agent::CheckedRequest checked =
      kvagent::agent::CheckRequest(frame, request_id, /*arena_bytes=*/1 << 20);
  if (!checked.status.ok() || checked.request == nullptr) return 0;
  // What the pipeline reads of an accepted request.
  const auto& r = *checked.request;
  uint64_t sink = r.request_id() + static_cast<uint64_t>(r.op()) + r.limit() + r.cursor();
  if (r.keys() != nullptr) {
    for (const auto* k : *r.keys()) sink += k->size();
  }
  if (r.buffers() != nullptr) {
    for (const auto* b : *r.buffers()) sink += b->offset() + b->length();
  }
  if (r.blocks() != nullptr) {
    for (const auto* b : *r.blocks()) {
      if (b->block_hashes() != nullptr) {
        for (const auto* h : *b->block_hashes()) sink += h->bits();
      }
      if (b->parent_block_hash() != nullptr) sink += b->parent_block_hash()->bits();
      if (b->token_ids() != nullptr) {
        for (uint32_t t : *b->token_ids()) sink += t;
      }
    }
  }
  if (const auto* o = r.options()) sink += o->replica_count() + o->soft_pin_ttl_ms();
  volatile uint64_t keep = sink;
  (void)keep;
  return 0;
}
