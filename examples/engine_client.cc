// engine_client: the kvagent SDK used the way an inference engine uses it.
//
//   engine_client [--run-dir DIR] [--sessions N] [--blocks N] [--block-bytes N]
//
// Each session (one request stream of an engine; one session ID has non-ASCII text, as real IDs
// can) has a prompt of `blocks * 16` token ids, generated deterministically from the session's
// index. The prompt is cut into KV blocks of 16 tokens, and each block gets a hash chained from
// its parent's, as vLLM's prefix cache does:
//
//   hash(block) = FNV-1a 64 over (parent hash as 8 bytes little-endian, then each token id as
//                 4 bytes little-endian); the first block's parent is kRootParentHash.
//
// A block is stored under "<key-prefix><hash as 16 hex digits>" with BlockMetadata (hash,
// parent, token ids, block size), so the agent's event stream announces it with exactly those
// hashes and the session that wrote it. The KV bytes are written in place into arena buffers
// (zero-copy: the agent copies them into its pool straight from this process's arena).
//
// Steps, one short line each: put every session's chain (one batched Put per session, all
// sessions submitted at once so the agent batches them together); look the chains up (Exist)
// and read the first half of each back, checking every byte; remove the last quarter of each
// chain and check that exactly those are gone. Then a summary. Exit 0 when every check held,
// 1 with one line saying what failed, 2 for a bad flag. Running it again against the same agent
// also passes: a block already stored answers "exists", which an engine treats as success.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "kvagent/client.h"
#include "kvagent/common/flags.h"

namespace {

using kvagent::ArenaBuffer;
using kvagent::BlockMetadata;
using kvagent::Client;
using kvagent::Reply;
using kvagent::Status;

constexpr uint32_t kBlockTokens = 16;    // tokens per KV block (vLLM's default)
constexpr uint32_t kVocabulary = 32000;  // token ids are below this (Llama's vocabulary)
constexpr uint64_t kRootParentHash = 0x6b76616765ULL;  // "kvage": the parent of a first block

struct Options {
  std::string run_dir = "/run/kvagent";
  uint64_t sessions = 4;
  uint64_t blocks = 8;
  uint64_t block_bytes = 64 << 10;
  std::string key_prefix = "engine/";
  int64_t timeout_ms = 30000;
};

// One session's prompt, cut into chained blocks.
struct Chain {
  std::string session;
  std::vector<std::string> keys;        // one per block
  std::vector<BlockMetadata> metadata;  // one per block
  std::vector<uint64_t> hashes;
  std::vector<std::string> session_ids;  // `session`, once per block (parallel to keys)
};

// Session IDs as an engine may have them: mostly ASCII, some not.
std::string SessionName(uint64_t index) {
  if (index == 1) return "sessão-1";
  if (index == 2) return "会话-2";
  return "sess-" + std::to_string(index);
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a 64 over `bytes` bytes of the little-endian representation of `value`, from `hash`.
uint64_t Fnv1a(uint64_t hash, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    hash ^= (value >> (8 * i)) & 0xff;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

uint64_t BlockHash(uint64_t parent, const uint32_t* tokens, uint32_t count) {
  uint64_t hash = Fnv1a(0xcbf29ce484222325ULL, parent, 8);
  for (uint32_t i = 0; i < count; ++i) hash = Fnv1a(hash, tokens[i], 4);
  return hash;
}

Chain MakeChain(uint64_t index, const Options& o) {
  Chain chain;
  chain.session = SessionName(index);
  std::vector<uint32_t> tokens(o.blocks * kBlockTokens);
  for (size_t t = 0; t < tokens.size(); ++t) {
    tokens[t] = static_cast<uint32_t>(SplitMix64((index + 1) * 1000003 + t) % kVocabulary);
  }
  uint64_t parent = kRootParentHash;
  for (uint64_t b = 0; b < o.blocks; ++b) {
    const uint32_t* block_tokens = tokens.data() + b * kBlockTokens;
    const uint64_t hash = BlockHash(parent, block_tokens, kBlockTokens);
    char key[64];
    std::snprintf(key, sizeof(key), "%016" PRIx64, hash);
    BlockMetadata meta;
    meta.block_hashes = {hash};
    meta.has_parent = b > 0;
    meta.parent_block_hash = b > 0 ? parent : 0;
    meta.token_ids.assign(block_tokens, block_tokens + kBlockTokens);
    meta.block_size = kBlockTokens;
    chain.keys.push_back(o.key_prefix + key);
    chain.metadata.push_back(std::move(meta));
    chain.hashes.push_back(hash);
    chain.session_ids.push_back(chain.session);
    parent = hash;
  }
  return chain;
}

// The KV bytes of the block with `hash`: 8-byte words derived from the hash and their index,
// so a block read back under another key, shifted or cut short never matches.
uint64_t KvWord(uint64_t hash, uint64_t word) {
  return SplitMix64(hash ^ (word * 0x2545f4914f6cdd1dULL));
}

void FillKv(uint64_t hash, uint8_t* data, size_t size) {
  for (size_t off = 0; off < size; off += 8) {
    const uint64_t w = KvWord(hash, off / 8);
    std::memcpy(data + off, &w, std::min<size_t>(8, size - off));
  }
}

// Offset of the first byte that differs from FillKv's, or `size` when all match.
size_t FirstMismatch(uint64_t hash, const uint8_t* data, size_t size) {
  for (size_t off = 0; off < size; off += 8) {
    const uint64_t w = KvWord(hash, off / 8);
    const size_t n = std::min<size_t>(8, size - off);
    if (std::memcmp(data + off, &w, n) != 0) {
      for (size_t i = 0; i < n; ++i) {
        if (data[off + i] != reinterpret_cast<const uint8_t*>(&w)[i]) return off + i;
      }
    }
  }
  return size;
}

// A failed check: INTERNAL with what failed (the SDK's own errors keep their code).
Status Failed(const std::string& what) { return kvagent::Internal(what); }

// The first failed key of `reply` as "[session] op KEY: CODE: message", and how many failed;
// a request-level failure fails every key.
Status KeyFailure(const Chain& chain, const char* op, const Reply& reply,
                  const std::vector<std::string>& keys) {
  if (!reply.ok()) {
    return Status(reply.status.code(),
                  "[" + chain.session + "] " + op + ": " + reply.status.message());
  }
  size_t failed = 0;
  Status first;
  for (size_t i = 0; i < reply.keys.size(); ++i) {
    if (reply.keys[i].ok()) continue;
    if (failed++ == 0) {
      first = Status(reply.keys[i].code, "[" + chain.session + "] " + op + " " + keys[i] + ": " +
                                             reply.keys[i].message);
    }
  }
  if (failed == 0) return Status::Ok();
  return Status(first.code(), first.message() + " (" + std::to_string(failed) + " of " +
                                  std::to_string(keys.size()) + " keys failed)");
}

// Step 1: fill each block in place, then one batched Put per session, all submitted before any
// is waited for (the agent batches what is ready together). Counts stored and existing blocks.
Status PutChains(Client& client, const Options& o, const std::vector<Chain>& chains,
                 uint64_t* stored, uint64_t* existed) {
  std::vector<std::vector<ArenaBuffer>> buffers(chains.size());
  std::vector<std::vector<kvagent::Value>> values(chains.size());
  for (size_t s = 0; s < chains.size(); ++s) {
    for (uint64_t b = 0; b < o.blocks; ++b) {
      auto buffer = client.Allocate(o.block_bytes);
      if (!buffer.ok()) return buffer.status();
      FillKv(chains[s].hashes[b], buffer->data(), buffer->size());
      buffers[s].push_back(std::move(*buffer));
    }
    for (const ArenaBuffer& buffer : buffers[s]) values[s].emplace_back(buffer);
  }
  // From the first submit on, nothing returns before every call was waited for: a call reads
  // the buffers it names until its Wait returns.
  std::vector<kvagent::PendingCall> calls;
  for (size_t s = 0; s < chains.size(); ++s) {
    kvagent::CallOptions call;
    call.session_ids = chains[s].session_ids;
    call.blocks = chains[s].metadata;
    calls.push_back(client.SubmitPut(chains[s].keys, values[s], call));
  }
  Status result;
  for (size_t s = 0; s < chains.size(); ++s) {
    Reply reply = calls[s].Wait();
    Status st = KeyFailure(chains[s], "put", reply, chains[s].keys);
    if (!st.ok()) {
      if (result.ok()) result = st;
      continue;
    }
    uint64_t here = 0;
    for (const auto& k : reply.keys) here += k.code == kvagent::ErrorCode::kObjectAlreadyExists;
    *stored += o.blocks - here;
    *existed += here;
    std::cout << "[" << chains[s].session << "] put " << o.blocks << " blocks ("
              << o.blocks * kBlockTokens << " tokens): " << o.blocks - here << " stored, " << here
              << " already there\n";
  }
  return result;
}

// Step 2: prefix lookup (Exist on the whole chain), then the first `reads` blocks read back
// into zeroed buffers, every byte checked.
Status ReadBack(Client& client, const Options& o, const Chain& chain, uint64_t reads) {
  Reply exist = client.Exist(chain.keys);
  KVAGENT_RETURN_IF_ERROR(KeyFailure(chain, "exist", exist, chain.keys));
  for (size_t b = 0; b < chain.keys.size(); ++b) {
    if (!exist.keys[b].exists) {
      return Failed("[" + chain.session + "] " + chain.keys[b] +
                    " was stored but Exist says it is not");
    }
  }
  std::vector<std::string> keys(chain.keys.begin(), chain.keys.begin() + reads);
  std::vector<ArenaBuffer> buffers;
  std::vector<const ArenaBuffer*> targets;
  for (uint64_t b = 0; b < reads; ++b) {
    auto buffer = client.Allocate(o.block_bytes);
    if (!buffer.ok()) return buffer.status();
    std::memset(buffer->data(), 0, buffer->size());  // stale bytes must not pass the check
    buffers.push_back(std::move(*buffer));
  }
  for (const ArenaBuffer& buffer : buffers) targets.push_back(&buffer);
  Reply got = client.Get(keys, targets);
  KVAGENT_RETURN_IF_ERROR(KeyFailure(chain, "get", got, keys));
  for (uint64_t b = 0; b < reads; ++b) {
    const std::string what = "[" + chain.session + "] get " + keys[b] + ": ";
    if (got.keys[b].length != o.block_bytes) {
      return Failed(what + std::to_string(got.keys[b].length) + " bytes, expected " +
                    std::to_string(o.block_bytes));
    }
    const size_t at = FirstMismatch(chain.hashes[b], buffers[b].data(), o.block_bytes);
    if (at != o.block_bytes) {
      return Failed(what + "byte " + std::to_string(at) + " differs from what was put");
    }
  }
  std::cout << "[" << chain.session << "] lookup: " << o.blocks << "/" << o.blocks
            << " blocks present; read " << reads << " back, every byte matches\n";
  return Status::Ok();
}

// Step 3: remove the last `drop` blocks (the engine no longer wants them cached) and check that
// exactly those are gone.
Status RemoveTail(Client& client, const Options& o, const Chain& chain, uint64_t drop) {
  std::vector<std::string> tail(chain.keys.end() - static_cast<ptrdiff_t>(drop), chain.keys.end());
  Reply rm = client.Remove(tail);
  KVAGENT_RETURN_IF_ERROR(KeyFailure(chain, "remove", rm, tail));
  Reply exist = client.Exist(chain.keys);
  KVAGENT_RETURN_IF_ERROR(KeyFailure(chain, "exist", exist, chain.keys));
  for (size_t b = 0; b < chain.keys.size(); ++b) {
    const bool want = b < chain.keys.size() - drop;
    if (exist.keys[b].exists != want) {
      return Failed("[" + chain.session + "] after removing the last " + std::to_string(drop) +
                    " blocks, " + chain.keys[b] + (want ? " is gone" : " is still there"));
    }
  }
  std::cout << "[" << chain.session << "] removed the last " << drop << " blocks; "
            << o.blocks - drop << "/" << o.blocks << " remain\n";
  return Status::Ok();
}

Status Run(const Options& o) {
  // Every session's chain is in the arena at once (the puts are in flight together).
  const uint64_t all_blocks = o.sessions * o.blocks * o.block_bytes;
  kvagent::ClientOptions client_options;
  client_options.run_dir = o.run_dir;
  client_options.client_name = "engine_client";
  client_options.arena_bytes =
      std::max<uint64_t>(64 << 20, all_blocks + all_blocks / 4 + (1 << 20));
  client_options.call_timeout = std::chrono::milliseconds(o.timeout_ms);
  auto connected = Client::Connect(client_options);
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  std::cout << "engine_client: connected to " << o.run_dir << "/agent.sock (client "
            << client.client_id() << ", arena " << (client.arena_bytes() >> 20) << " MiB); "
            << o.sessions << " sessions x " << o.blocks << " blocks of " << kBlockTokens
            << " tokens, " << o.block_bytes << " bytes each\n";

  std::vector<Chain> chains;
  for (uint64_t s = 0; s < o.sessions; ++s) chains.push_back(MakeChain(s, o));
  uint64_t stored = 0, existed = 0;
  KVAGENT_RETURN_IF_ERROR(PutChains(client, o, chains, &stored, &existed));
  const uint64_t reads = (o.blocks + 1) / 2;
  for (const Chain& chain : chains) KVAGENT_RETURN_IF_ERROR(ReadBack(client, o, chain, reads));
  const uint64_t drop = std::max<uint64_t>(1, o.blocks / 4);
  for (const Chain& chain : chains) KVAGENT_RETURN_IF_ERROR(RemoveTail(client, o, chain, drop));
  std::cout << "engine_client: OK: " << o.sessions << " sessions, " << stored << " blocks stored ("
            << existed << " already there), " << reads * chains.size()
            << " read back and verified, " << drop * chains.size() << " removed\n";
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  kvagent::FlagSet flags("engine_client",
                         "stores, reads back and removes chains of KV blocks for several "
                         "sessions through the kvagent SDK, as an inference engine would");
  flags.String("run-dir", &o.run_dir, "the agent's run directory (its agent.sock)");
  flags.Uint("sessions", &o.sessions, "sessions (request streams), 1..64");
  flags.Uint("blocks", &o.blocks, "KV blocks per session (16 tokens each), 1..4096");
  flags.Size("block-bytes", &o.block_bytes, "bytes of one KV block, 1 B..64 MiB");
  flags.String("key-prefix", &o.key_prefix, "prefix of every block's key");
  flags.Int("timeout-ms", &o.timeout_ms, "timeout of each call");
  if (Status st = flags.Parse(argc, argv); !st.ok()) {
    std::cerr << "engine_client: " << st.message() << "\n";
    return 2;
  }
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (o.sessions < 1 || o.sessions > 64 || o.blocks < 1 || o.blocks > 4096 || o.block_bytes < 1 ||
      o.block_bytes > (64 << 20) || o.timeout_ms <= 0) {
    std::cerr << "engine_client: --sessions 1..64, --blocks 1..4096, --block-bytes 1B..64MiB and "
                 "--timeout-ms > 0 (see engine_client --help)\n";
    return 2;
  }
  // One line per step, out as soon as the step is done (also through a pipe, as in make demo).
  std::cout << std::unitbuf;
  if (Status st = Run(o); !st.ok()) {
    std::cerr << "engine_client: FAILED: " << st.ToString() << "\n";
    return 1;
  }
  return 0;
}
