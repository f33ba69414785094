// What an operator (or whatever writes their files) gives kvagent and kvmaster before start-up:
// a TOML config file (FlagSet::ApplyConfigText, toml++) and command-line arguments (CLI11),
// then every check the daemons run on them (CheckAgentFlags, CheckKvmasterFlags: sizes, listen
// and cluster addresses, log sync modes, HA options). The input is the config text up to the
// first NUL, then NUL-separated arguments. Must never crash, hit UB or allocate out of proportion:
// bad input is an INVALID_PARAMS status with a message.
//
// Arguments naming files (--config, the secret file) are dropped: the harness reads no files.
#include <glog/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "agent_flags.h"
#include "kvmaster_flags.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  return 0;
}

namespace {

struct Input {
  std::string_view config;
  std::vector<std::string> args;
};

Input Split(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  Input in;
  const size_t nul = all.find('\0');
  in.config = all.substr(0, nul);
  if (nul == std::string_view::npos) return in;
  std::string_view rest = all.substr(nul + 1);
  while (!rest.empty() && in.args.size() < 64) {
    const size_t end = rest.find('\0');
    const std::string_view arg = rest.substr(0, end);
    if (arg.find("config") == std::string_view::npos &&
        arg.find("file") == std::string_view::npos) {
      in.args.emplace_back(arg);
    }
    if (end == std::string_view::npos) break;
    rest = rest.substr(end + 1);
  }
  return in;
}

kvagent::Status ParseArgs(kvagent::FlagSet& flags, const char* program,
                          std::vector<std::string> args) {
  args.insert(args.begin(), program);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> positionals;
  return flags.Parse(static_cast<int>(args.size()), argv.data(), &positionals);
}

void ExpectMessage(const kvagent::Status& st) {
  if (!st.ok() && st.message().empty()) std::abort();  // every refusal says what is wrong
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Input in = Split(data, size);
  {
    kvagent::agent::AgentFlags v;
    kvagent::FlagSet flags("kvagent", "fuzz");
    kvagent::agent::DeclareAgentFlags(flags, v);
    kvagent::Status st = flags.ApplyConfigText(in.config, "fuzz.toml");
    if (st.ok()) st = ParseArgs(flags, "kvagent", in.args);
    if (st.ok()) st = kvagent::agent::CheckAgentFlags(v);
    ExpectMessage(st);
  }
  {
    kvagent::master::KvmasterFlags v;
    kvagent::FlagSet flags("kvmaster", "fuzz");
    kvagent::master::DeclareKvmasterFlags(flags, v);
    kvagent::Status st = flags.ApplyConfigText(in.config, "fuzz.toml");
    if (st.ok()) st = ParseArgs(flags, "kvmaster", in.args);
    if (st.ok()) st = kvagent::master::CheckKvmasterFlags(v);
    ExpectMessage(st);
  }
  return 0;
}
