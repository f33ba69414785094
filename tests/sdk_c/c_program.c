/* A plain C11 user of <kvagent/client_c.h> (built with -pedantic -Werror): connects to the agent
 * whose run directory is argv[1], fills an arena buffer, pings synchronously and
 * asynchronously, and checks a local validation error. Exit 0 when everything held. */
#include <stdio.h>
#include <string.h>

#include "kvagent/client_c.h"

#define CHECK(cond)                                                         \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: %s failed (%s)\n", __FILE__, __LINE__, #cond, \
              kv_last_error_message());                                     \
      return 1;                                                             \
    }                                                                       \
  } while (0)

static int run(kv_client_t* client) {
  kv_buffer_t* buffer = NULL;
  kv_pending_t* pending = NULL;
  kv_result_t* result = NULL;
  char long_id[300];
  kv_bytes_t key = {"key", 3};
  kv_bytes_t session;
  kv_value_t value;
  int failed;

  CHECK(kv_allocate(client, 4096, &buffer) == KV_OK);
  memset(kv_buffer_data(buffer), 7, kv_buffer_size(buffer));
  CHECK(kv_ping(client, 0) == KV_OK);
  CHECK(kv_submit_ping(client, 0, &pending) == KV_OK);
  CHECK(kv_pending_wait(pending, NULL) == KV_OK);
  kv_pending_free(pending);

  memset(long_id, 's', sizeof long_id);
  session.data = long_id;
  session.size = sizeof long_id;
  value.buffer = buffer;
  value.bytes = NULL;
  value.size = kv_buffer_size(buffer);
  CHECK(kv_put(client, 1, &key, &value, &session, NULL, NULL, &result) == KV_INVALID_PARAMS);
  failed = result->key_count != 1 || result->keys[0].code != KV_INVALID_PARAMS ||
           strcmp(kv_status_name(result->status), "INVALID_PARAMS") != 0;
  kv_result_free(result);
  kv_buffer_free(buffer);
  CHECK(!failed);
  return 0;
}

int main(int argc, char** argv) {
  kv_connect_options_t options;
  kv_client_t* client = NULL;
  int rc;
  if (argc != 2) {
    fprintf(stderr, "usage: %s <agent run dir>\n", argv[0]);
    return 2;
  }
  kv_connect_options_init(&options);
  options.run_dir = argv[1];
  options.client_name = "c-program";
  options.arena_bytes = 1 << 20;
  if (kv_connect(&options, &client) != KV_OK) {
    fprintf(stderr, "kv_connect: %s\n", kv_last_error_message());
    return 1;
  }
  rc = run(client);
  kv_client_free(client);
  return rc;
}
