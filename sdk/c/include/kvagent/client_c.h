/* The kvagent SDK's C ABI (libkvclient.so): what C engines and language bindings link.
 *
 *   kv_connect_options_t options;
 *   kv_connect_options_init(&options);
 *   options.run_dir = "/run/kvagent";
 *   options.client_name = "trtllm-0";
 *   kv_client_t* client = NULL;
 *   if (kv_connect(&options, &client) != KV_OK) {
 *     fprintf(stderr, "%s\n", kv_last_error_message());   // says what to do
 *   }
 *   kv_buffer_t* block = NULL;
 *   kv_allocate(client, block_bytes, &block);
 *   fill_kv_block(kv_buffer_data(block), kv_buffer_size(block));  // in place: zero-copy
 *   kv_bytes_t key = {"block-0", 7}, session = {"session-42", 10};
 *   kv_value_t value = {block, NULL, block_bytes};
 *   kv_result_t* r = NULL;
 *   kv_put(client, 1, &key, &value, &session, NULL, NULL, &r);
 *   for (size_t i = 0; i < r->key_count; ++i)
 *     if (!kv_key_succeeded(r->keys[i].code)) { ... r->keys[i].message ... }
 *   kv_result_free(r);
 *   kv_buffer_free(block);
 *   kv_client_free(client);
 *
 * Errors. Every function that can fail returns a kv_status_t: the ErrorCode wire values of
 * kvagent (common/status.h), named as in docs/semantics.md. The message that goes with the last
 * status a kv_* call returned on the calling thread is kv_last_error_message(). Calls with
 * per-key outcomes also hand back a kv_result_t that carries the request-level status and
 * message and one code and message per key. No C++ exception ever leaves this library: anything
 * unexpected becomes KV_INTERNAL with a message.
 *
 * Byte strings. Keys, session IDs and LoRA names are kv_bytes_t (pointer + length), so they may
 * hold any bytes, including NUL; the library validates them (UTF-8, lengths) and answers
 * KV_INVALID_PARAMS locally, without a round trip, when they break docs/semantics.md's rules.
 *
 * Ownership. Every pointer the caller passes in is borrowed for the duration of the call only:
 * keys, session IDs, raw values and block metadata are copied before a submit returns. The one
 * exception is kv_buffer_t: a call that names a buffer holds its own reference until the call
 * completes, so freeing the buffer early is safe (its arena range is returned once the call is
 * done). Every object the library returns (kv_client_t, kv_buffer_t, kv_pending_t, kv_result_t)
 * belongs to the caller and is released with its kv_*_free function; each free function accepts
 * NULL.
 *
 * Threads. A kv_client_t may be used by many threads at once (like kvagent::Client), except that
 * kv_client_free must be the last call on it. kv_buffer_t accessors may be called from any thread.
 * A kv_pending_t is used by one thread at a time. A kv_result_t is immutable.
 */
#ifndef KVAGENT_CLIENT_C_H_
#define KVAGENT_CLIENT_C_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KV_API __attribute__((visibility("default")))

/* Status codes: the wire values of kvagent::ErrorCode. Never renumbered; new codes are appended,
 * so treat an unknown value as KV_INTERNAL. */
typedef enum kv_status {
  KV_OK = 0,
  KV_INVALID_PARAMS = 1,
  KV_OBJECT_NOT_FOUND = 2,
  KV_OBJECT_ALREADY_EXISTS = 3, /* Put of a key already stored: callers treat it as success */
  KV_REPLICA_NOT_READY = 4,
  KV_OBJECT_BUSY = 5,
  KV_OBJECT_HAS_LEASE = 6,
  KV_NO_SPACE = 7,
  KV_BUFFER_OUT_OF_RANGE = 8,
  KV_TRANSFER_FAILED = 9,
  KV_TIMEOUT = 10,
  KV_AGENT_UNAVAILABLE = 11, /* request level: the agent is gone or refused us */
  KV_MASTER_UNAVAILABLE = 12,
  KV_INTERNAL = 13,
  KV_DATA_CORRUPTED = 14, /* Get: every replica failed its checksum (dropped): put it again */
} kv_status_t;

/* "OK", "INVALID_PARAMS", ... as docs/semantics.md spells them; "INTERNAL" for unknown values.
 * Returns a static string. */
KV_API const char* kv_status_name(kv_status_t status);

/* Non-zero when a per-key code means the key was stored or read: KV_OK, or
 * KV_OBJECT_ALREADY_EXISTS for a Put. */
static inline int kv_key_succeeded(kv_status_t code) {
  return code == KV_OK || code == KV_OBJECT_ALREADY_EXISTS;
}

/* The message of the status most recently returned by a kv_* function on this thread ("" after
 * KV_OK). NUL-terminated, owned by the library, valid until the next kv_* call on this thread. */
KV_API const char* kv_last_error_message(void);

/* The library's version, "MAJOR.MINOR.PATCH" (static string). The SONAME carries MAJOR. */
KV_API const char* kv_version(void);

/* The most keys one call takes (kvagent::kMaxBatchKeys); more is KV_INVALID_PARAMS. */
#define KV_MAX_BATCH_KEYS 65536

/* Bytes the caller owns: `size` bytes at `data` (data may be NULL only when size is 0). */
typedef struct kv_bytes {
  const void* data;
  size_t size;
} kv_bytes_t;

typedef struct kv_client kv_client_t;   /* a connection to the node agent */
typedef struct kv_buffer kv_buffer_t;   /* a range of the client's shared-memory data arena */
typedef struct kv_pending kv_pending_t; /* a submitted call not yet collected */

/* ---- options (versioned by struct_size) --------------------------------------------------
 * Initialize with the matching *_init function (inline: it zeroes the struct, sets struct_size
 * to the size this header knows and fills the defaults), then set what you need. The library
 * reads the fields that lie within struct_size; a struct_size larger than the library knows is
 * accepted when the extra bytes are zero (fields of a newer header left unset: every field added
 * later takes 0 as its default) and refused with KV_INVALID_PARAMS otherwise (upgrade
 * libkvclient), so an option the caller set is never silently ignored. A struct_size of an
 * older header (fields appended since are missing) is accepted and those fields take 0; one
 * smaller than the first published version is refused. Passing NULL means defaults. */

typedef struct kv_connect_options {
  size_t struct_size;
  const char* run_dir;         /* directory of the agent's agent.sock; NULL or "": /run/kvagent */
  const char* client_name;     /* for the agent's logs; NULL or "": "<program>:<pid>" */
  uint64_t arena_bytes;        /* data arena wanted (the agent may grant less); 0: 64 MiB */
  uint64_t ring_bytes;         /* each ring, a power of two; 0: the agent's default */
  uint32_t connect_timeout_ms; /* 0: 5000 */
  uint32_t call_timeout_ms;    /* default for calls that give none; 0: 30000 */
  uint32_t spin_us;            /* how long a waiting caller spins before it sleeps */
  uint32_t max_in_flight;      /* calls in flight at once (submit waits beyond); 0: 4096 */
  /* Added after 0.1.0 (an older struct_size leaves these 0). Non-zero: let the agent read and write
   * this process's memory directly (process_vm_readv/writev), so values given as memory
   * (kv_put_from, kv_get_into, and raw bytes of kv_put) cross memory once, straight between this
   * process and the node pool. The agent grants it when it may read this process (same user, or
   * CAP_SYS_PTRACE; under Yama ptrace_scope 1 the library names the agent with
   * prctl(PR_SET_PTRACER)); see kv_client_process_memory. Without it such values are copied through
   * the arena. */
  uint8_t process_memory;
  /* With process_memory: arena bytes set aside for parts of values that travel to or from a
   * peer's pool; 0: a quarter of the arena, at most 64 MiB. */
  uint64_t peer_scratch_bytes;
} kv_connect_options_t;

static inline void kv_connect_options_init(kv_connect_options_t* options) {
  memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->spin_us = 50;
}

/* Options of Put and Upsert. */
typedef struct kv_write_options {
  size_t struct_size;
  uint32_t timeout_ms;      /* 0: the client's call timeout */
  uint32_t soft_pin_ttl_ms; /* 0: the master's default */
  uint8_t replica_count;    /* replicas on distinct agents (best effort); init: 1 */
  uint8_t soft_pin;         /* non-zero: evicted only after unpinned objects */
  uint8_t hard_pin;         /* non-zero: never evicted */
} kv_write_options_t;

static inline void kv_write_options_init(kv_write_options_t* options) {
  memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->replica_count = 1;
}

/* Options of Get, Exist, Remove and RemoveAll. */
typedef struct kv_call_options {
  size_t struct_size;
  uint32_t timeout_ms; /* 0: the client's call timeout */
  uint8_t force;       /* Remove/RemoveAll: non-zero removes even leased objects */
} kv_call_options_t;

static inline void kv_call_options_init(kv_call_options_t* options) {
  memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
}

/* Options of List. */
typedef struct kv_list_options {
  size_t struct_size;
  kv_bytes_t prefix;   /* only keys that start with these bytes; empty: every key */
  uint64_t cursor;     /* 0 to start a scan, then the previous page's next_cursor */
  uint32_t limit;      /* about this many keys per page, at most 10000; 0: 1000 */
  uint32_t timeout_ms; /* 0: the client's call timeout */
} kv_list_options_t;

static inline void kv_list_options_init(kv_list_options_t* options) {
  memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->limit = 1000;
}

/* ---- arguments ---------------------------------------------------------------------------- */

/* A value to store: with `buffer`, its first `size` bytes are stored without a copy (size must
 * not exceed kv_buffer_size); without (NULL), `size` bytes at `bytes` are copied into the arena
 * for the duration of the call. A value is at least 1 byte. */
typedef struct kv_value {
  const kv_buffer_t* buffer;
  const void* bytes;
  size_t size;
} kv_value_t;

/* A range of the calling process's own memory (any buffer: a host KV pool, a tensor). */
typedef struct kv_memory_range {
  void* data;
  size_t size;
} kv_memory_range_t;

/* Metadata of the KV block(s) a key holds; becomes the key's BlockStored event (docs/events.md).
 * An entry with hash_count 0, token_count 0 and an empty lora_name means "no metadata for this
 * key". This struct is an array element and never grows: a future version gets a new type. */
typedef struct kv_block {
  const uint64_t* hashes; /* hash_count block hashes, first block first */
  size_t hash_count;
  const uint32_t* token_ids; /* none (block_size 0), or block_size * hash_count */
  size_t token_count;
  uint64_t parent_hash; /* read when has_parent is non-zero */
  kv_bytes_t lora_name; /* UTF-8; empty: none */
  uint32_t block_size;
  uint8_t hashes_signed; /* non-zero: SGLang-style signed hashes on the event stream */
  uint8_t has_parent;
} kv_block_t;

/* ---- results ------------------------------------------------------------------------------ */

typedef struct kv_key_result {
  kv_status_t code;    /* see kv_key_succeeded */
  uint32_t exists;     /* Exist: 1 when the object is readable */
  uint64_t length;     /* Get: the value's length in bytes */
  const char* message; /* what went wrong and what to do; "" when OK; NUL-terminated */
  size_t message_size; /* strlen(message) */
  /* Put/Upsert that stored the value: replicas written (of its part with the fewest; fewer than
   * asked when some could not be written). 0 otherwise. */
  uint32_t replicas;
} kv_key_result_t;

/* List: one stored object. The bytes point into the kv_result_t. */
typedef struct kv_listed_key {
  kv_bytes_t key;
  uint64_t size;         /* value bytes */
  kv_bytes_t session_id; /* empty when untagged */
} kv_listed_key_t;

/* Stat: one counter. The strings point into the kv_result_t. */
typedef struct kv_counter {
  const char* name; /* e.g. "agent.requests.put" or "master.keys"; NUL-terminated */
  size_t name_size;
  uint64_t value;
  const char* text; /* "" unless the value is a word (e.g. "agent.master_link"); NUL-terminated */
  size_t text_size;
} kv_counter_t;

/* The outcome of a call. Allocated by the library only (fields may be appended in later
 * versions) and released with kv_result_free, which also frees every string it points to.
 * `status` is the request-level result: KV_OK when every key was attempted (look at `keys`),
 * otherwise why none was, and then every key carries the same code and message. */
typedef struct kv_result {
  kv_status_t status;
  const char* message; /* NUL-terminated; "" when OK */
  size_t message_size;
  /* key_count entries, one per key of the request, in order; none when the request's count
   * was above KV_MAX_BATCH_KEYS. */
  const kv_key_result_t* keys;
  size_t key_count;
  uint64_t removed_count;        /* RemoveAll: objects removed */
  const kv_listed_key_t* listed; /* List: listed_count keys of this page */
  size_t listed_count;
  uint64_t next_cursor;         /* List: for the next page; 0 when the scan is complete */
  const kv_counter_t* counters; /* Stat: counter_count counters */
  size_t counter_count;
  void* internal; /* the library's; do not touch */
} kv_result_t;

/* Releases a result and everything it points to. NULL is a no-op. */
KV_API void kv_result_free(kv_result_t* result);

/* ---- client ------------------------------------------------------------------------------- */

/* Connects to the agent at <run_dir>/agent.sock, performs the handshake and maps the shared
 * segment. On KV_OK, *client is a new client the caller frees with kv_client_free; otherwise
 * *client is NULL and kv_last_error_message() says why: KV_AGENT_UNAVAILABLE when no agent
 * listens or it refused us, KV_TIMEOUT when it did not answer within connect_timeout_ms,
 * KV_INVALID_PARAMS for bad options. */
KV_API kv_status_t kv_connect(const kv_connect_options_t* options, kv_client_t** client);

/* Closes the connection (the agent reclaims the segment) and frees the client. Calls still
 * pending fail with KV_AGENT_UNAVAILABLE; buffers stay valid until they are freed. NULL is a
 * no-op. */
KV_API void kv_client_free(kv_client_t* client);

/* The id the agent gave this client, the agent's incarnation (drawn anew at each agent start)
 * and the arena size it granted (0 for NULL). */
KV_API uint64_t kv_client_id(const kv_client_t* client);
KV_API uint64_t kv_client_agent_incarnation(const kv_client_t* client);
/* Deprecated: the former name of kv_client_agent_incarnation, returning the same value (kept
 * exported by libkvclient.so.0). */
KV_API uint64_t kv_client_agent_epoch(const kv_client_t* client);
KV_API uint64_t kv_client_arena_bytes(const kv_client_t* client);
/* 0 once the agent is known to be gone (then every call fails with KV_AGENT_UNAVAILABLE). */
KV_API int kv_client_connected(const kv_client_t* client);
/* 1 when the agent reads and writes this process's memory directly (asked with
 * kv_connect_options_t.process_memory and granted at connect), else 0. */
KV_API int kv_client_process_memory(const kv_client_t* client);

/* ---- arena buffers ------------------------------------------------------------------------ */

/* Allocates `size` bytes of the client's arena (best fit). On KV_OK *buffer is a new buffer the
 * caller frees with kv_buffer_free; KV_NO_SPACE when no free extent is large enough (the
 * message gives the largest). A buffer stays usable after its client is freed. */
KV_API kv_status_t kv_allocate(kv_client_t* client, size_t size, kv_buffer_t** buffer);

/* Drops the caller's reference; the range returns to the arena once no pending call uses it.
 * NULL is a no-op. */
KV_API void kv_buffer_free(kv_buffer_t* buffer);

/* The buffer's memory (writable, kv_buffer_size bytes, valid until kv_buffer_free) and size. */
KV_API void* kv_buffer_data(const kv_buffer_t* buffer);
KV_API size_t kv_buffer_size(const kv_buffer_t* buffer);

/* ---- synchronous calls --------------------------------------------------------------------
 * Each returns the request-level status and, when `result` is not NULL, sets *result to a new
 * kv_result_t (per-key outcomes; free with kv_result_free) on every return except an
 * out-of-memory KV_INTERNAL, where it is NULL. Per-key arrays have `count` entries (at most
 * KV_MAX_BATCH_KEYS); optional ones may be NULL. */

/* A round trip to the agent with no keys. timeout_ms 0: the client's call timeout. */
KV_API kv_status_t kv_ping(kv_client_t* client, uint32_t timeout_ms);

/* Stores new objects: OBJECT_ALREADY_EXISTS per key already stored. `session_ids`: one per key
 * (empty = untagged) or NULL; `blocks`: one per key or NULL. */
KV_API kv_status_t kv_put(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                          const kv_value_t* values, const kv_bytes_t* session_ids,
                          const kv_block_t* blocks, const kv_write_options_t* options,
                          kv_result_t** result);

/* Stores or replaces objects; same arguments as kv_put. */
KV_API kv_status_t kv_upsert(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                             const kv_value_t* values, const kv_bytes_t* session_ids,
                             const kv_block_t* blocks, const kv_write_options_t* options,
                             kv_result_t** result);

/* Reads each key's value into the matching buffer (its size is the capacity); the value's
 * length is keys[i].length. */
KV_API kv_status_t kv_get(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                          kv_buffer_t* const* buffers, const kv_call_options_t* options,
                          kv_result_t** result);

/* Like kv_put / kv_upsert / kv_get with values in this process's memory instead of arena
 * buffers. Key i uses range_counts[i] consecutive entries of `ranges` (NULL range_counts: one
 * each): a put stores their concatenation, a get fills them in order (their total is the
 * capacity; keys[i].length is the value's length). With process memory the agent copies
 * straight between them and the node pool; otherwise the library copies them through temporary
 * arena buffers (a get's copy happens before the call returns, or in kv_pending_wait). A range
 * the agent cannot read (put) or write (get) fails its key with KV_INVALID_PARAMS. The memory
 * must stay valid until the call returns (asynchronous: until kv_pending_wait returns); a
 * get's ranges must not be read or written by anyone else meanwhile. */
KV_API kv_status_t kv_put_from(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                               const kv_memory_range_t* ranges, const size_t* range_counts,
                               const kv_bytes_t* session_ids, const kv_block_t* blocks,
                               const kv_write_options_t* options, kv_result_t** result);
KV_API kv_status_t kv_upsert_from(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                                  const kv_memory_range_t* ranges, const size_t* range_counts,
                                  const kv_bytes_t* session_ids, const kv_block_t* blocks,
                                  const kv_write_options_t* options, kv_result_t** result);
KV_API kv_status_t kv_get_into(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                               const kv_memory_range_t* ranges, const size_t* range_counts,
                               const kv_call_options_t* options, kv_result_t** result);

/* keys[i].exists tells whether each object is readable. */
KV_API kv_status_t kv_exist(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                            const kv_call_options_t* options, kv_result_t** result);

/* Removes the objects (leased ones only with options->force). */
KV_API kv_status_t kv_remove(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                             const kv_call_options_t* options, kv_result_t** result);

/* Removes every object in the store; the count is removed_count. */
KV_API kv_status_t kv_remove_all(kv_client_t* client, const kv_call_options_t* options,
                                 kv_result_t** result);

/* One page of the stored keys, with their value sizes and session IDs, in (*result)->listed.
 * Every key present during a whole scan (cursor 0 until next_cursor is 0) is listed exactly
 * once; a page may be shorter or somewhat longer than the limit, and may be empty before the
 * scan ends. */
KV_API kv_status_t kv_list(kv_client_t* client, const kv_list_options_t* options,
                           kv_result_t** result);

/* The agent's counters ("agent.*") and its master's ("master.*") in (*result)->counters. */
KV_API kv_status_t kv_stat(kv_client_t* client, uint32_t timeout_ms, kv_result_t** result);

/* ---- asynchronous calls -------------------------------------------------------------------
 * Same arguments as the synchronous forms; the call is submitted before the function returns
 * and *pending is a new handle the caller collects with kv_pending_wait and frees with
 * kv_pending_free. Local validation errors and agent failures are collected the same way:
 * these functions return KV_OK whenever *pending was set, and KV_INVALID_PARAMS (NULL client
 * or pending) or KV_INTERNAL (out of memory) otherwise. */

KV_API kv_status_t kv_submit_ping(kv_client_t* client, uint32_t timeout_ms, kv_pending_t** pending);
KV_API kv_status_t kv_submit_put(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                                 const kv_value_t* values, const kv_bytes_t* session_ids,
                                 const kv_block_t* blocks, const kv_write_options_t* options,
                                 kv_pending_t** pending);
KV_API kv_status_t kv_submit_upsert(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                                    const kv_value_t* values, const kv_bytes_t* session_ids,
                                    const kv_block_t* blocks, const kv_write_options_t* options,
                                    kv_pending_t** pending);
KV_API kv_status_t kv_submit_get(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                                 kv_buffer_t* const* buffers, const kv_call_options_t* options,
                                 kv_pending_t** pending);
KV_API kv_status_t kv_submit_put_from(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                                      const kv_memory_range_t* ranges, const size_t* range_counts,
                                      const kv_bytes_t* session_ids, const kv_block_t* blocks,
                                      const kv_write_options_t* options, kv_pending_t** pending);
KV_API kv_status_t kv_submit_upsert_from(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                                         const kv_memory_range_t* ranges,
                                         const size_t* range_counts, const kv_bytes_t* session_ids,
                                         const kv_block_t* blocks,
                                         const kv_write_options_t* options, kv_pending_t** pending);
KV_API kv_status_t kv_submit_get_into(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                                      const kv_memory_range_t* ranges, const size_t* range_counts,
                                      const kv_call_options_t* options, kv_pending_t** pending);
KV_API kv_status_t kv_submit_exist(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                                   const kv_call_options_t* options, kv_pending_t** pending);
KV_API kv_status_t kv_submit_remove(kv_client_t* client, size_t count, const kv_bytes_t* keys,
                                    const kv_call_options_t* options, kv_pending_t** pending);
KV_API kv_status_t kv_submit_remove_all(kv_client_t* client, const kv_call_options_t* options,
                                        kv_pending_t** pending);

KV_API kv_status_t kv_submit_list(kv_client_t* client, const kv_list_options_t* options,
                                  kv_pending_t** pending);
KV_API kv_status_t kv_submit_stat(kv_client_t* client, uint32_t timeout_ms, kv_pending_t** pending);

/* Non-zero when kv_pending_wait would return at once. Never blocks. */
KV_API int kv_pending_ready(kv_pending_t* pending);

/* Blocks until the reply arrives or the call's timeout passes (then KV_TIMEOUT), and returns
 * like the synchronous call would (setting *result when result is not NULL). Once per call: a
 * second wait answers KV_INVALID_PARAMS. The buffers of a call that timed out stay reserved
 * until the client is freed, since the agent may still answer it late (the same holds for the
 * synchronous calls). */
KV_API kv_status_t kv_pending_wait(kv_pending_t* pending, kv_result_t** result);

/* Frees the handle. A call not yet collected is abandoned: its reply is dropped when it
 * arrives, and the buffers it names stay reserved until then (or until its timeout passes, or
 * its client is freed). While the agent is moving the call's bytes it first waits for that
 * move to end. NULL is a no-op. */
KV_API void kv_pending_free(kv_pending_t* pending);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVAGENT_CLIENT_C_H_ */
