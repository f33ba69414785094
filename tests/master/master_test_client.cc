// master_test_client: drives a real kvmaster for the Python tests (which have no FlatBuffers).
//
//   master_test_client RPC_ENDPOINT COMMAND...
//     put KEY=SESSION...   register agent "py-node", mount 1 MiB, one batch PutStart + PutEnd
//     upsert KEY=SESSION...  one batch UpsertStart + UpsertEnd
//     remove KEY...        one BatchRemove (force)
//     removeall            RemoveAll (force)
// Exits 0 when every key of every command was OK; otherwise prints the failure and exits 1.
#include <cstdio>
#include <string>
#include <vector>

#include "zmq_test_client.h"

using namespace kvagent::master::testing;  // NOLINT

namespace {

bool Ok(const fb::Reply* r, const char* what) {
  if (!r) {
    std::fprintf(stderr, "%s: no (valid) reply\n", what);
    return false;
  }
  if (r->status() != 0) {
    std::fprintf(stderr, "%s: status %u: %s\n", what, r->status(),
                 r->message() ? r->message()->c_str() : "");
    return false;
  }
  const flatbuffers::Vector<uint16_t>* codes = nullptr;
  if (auto* p = r->body_as_PlacementReply()) codes = p->codes();
  if (auto* k = r->body_as_KeyCodesReply()) codes = k->codes();
  if (codes) {
    for (size_t i = 0; i < codes->size(); ++i) {
      if (codes->Get(i) != 0) {
        std::fprintf(stderr, "%s: key %zu failed with code %u\n", what, i, codes->Get(i));
        return false;
      }
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: master_test_client RPC_ENDPOINT COMMAND...\n");
    return 2;
  }
  MasterClient client(argv[1]);
  std::string buf;
  const fb::Reply* r = client.Call(RegisterAgentMsg("py-node", 1), &buf);
  if (!Ok(r, "register")) return 1;
  const uint32_t agent = r->body_as_RegisterAgentReply()->agent_id();
  if (!Ok(client.Call(MountPoolMsg(agent, 1 << 20, "tcp://127.0.0.1:1"), &buf), "mount")) {
    return 1;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  auto is_command = [](const std::string& a) {
    return a == "put" || a == "upsert" || a == "remove" || a == "removeall";
  };
  for (size_t i = 0; i < args.size();) {
    const std::string cmd = args[i++];
    std::vector<std::string> keys, sessions;
    while (i < args.size() && !is_command(args[i])) {
      const std::string& a = args[i++];
      const size_t eq = a.find('=');
      keys.push_back(a.substr(0, eq));
      sessions.push_back(eq == std::string::npos ? "" : a.substr(eq + 1));
    }
    if (cmd == "put" || cmd == "upsert") {
      const bool upsert = cmd == "upsert";
      std::vector<uint64_t> sizes(keys.size(), 4096);
      if (!Ok(client.Call(WriteStartMsg(agent, keys, sizes, sessions, upsert), &buf), "start")) {
        return 1;
      }
      auto end = upsert ? fb::Body::BatchUpsertEnd : fb::Body::BatchPutEnd;
      if (!Ok(client.Call(WriteFinishMsg(end, agent, keys), &buf), "end")) return 1;
    } else if (cmd == "remove") {
      if (!Ok(client.Call(KeysMsg(fb::Body::BatchRemove, keys, true), &buf), "remove")) {
        return 1;
      }
    } else if (cmd == "removeall") {
      if (!Ok(client.Call(RemoveAllMsg(true), &buf), "removeall")) return 1;
    } else {
      std::fprintf(stderr, "unknown command %s\n", cmd.c_str());
      return 2;
    }
  }
  return 0;
}
