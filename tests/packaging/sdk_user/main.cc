// A C++ program built against the installed SDK (found with find_package(kvagent) or with
// pkg-config kvclient): stores a value through the node's kvagent and reads it back.
// Usage: sdk_user <agent run dir>. Prints "round trip ok" and exits 0 when it all worked.
#include <kvagent/client_c.h>

#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  kv_connect_options_t options;
  kv_connect_options_init(&options);
  options.run_dir = argv[1];
  options.client_name = "packaged-sdk-user";
  kv_client_t* client = nullptr;
  if (kv_connect(&options, &client) != KV_OK) {
    std::fprintf(stderr, "connect: %s\n", kv_last_error_message());
    return 1;
  }
  const std::string payload =
      "stored through the packaged libkvclient " + std::string(kv_version());
  kv_bytes_t key = {"packaged", 8};
  kv_value_t value{};
  value.bytes = payload.data();
  value.size = payload.size();
  kv_result_t* result = nullptr;
  if (kv_put(client, 1, &key, &value, nullptr, nullptr, nullptr, &result) != KV_OK) {
    std::fprintf(stderr, "put: %s\n", kv_last_error_message());
    return 1;
  }
  kv_result_free(result);
  kv_buffer_t* buffer = nullptr;
  if (kv_allocate(client, 4096, &buffer) != KV_OK) return 1;
  if (kv_get(client, 1, &key, &buffer, nullptr, &result) != KV_OK) {
    std::fprintf(stderr, "get: %s\n", kv_last_error_message());
    return 1;
  }
  const bool same = result->keys[0].length == payload.size() &&
                    std::memcmp(kv_buffer_data(buffer), payload.data(), payload.size()) == 0;
  kv_result_free(result);
  kv_buffer_free(buffer);
  kv_client_free(client);
  std::printf(same ? "round trip ok\n" : "round trip MISMATCH\n");
  return same ? 0 : 1;
}
