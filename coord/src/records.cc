#include "kvagent/coord/records.h"

#include <tuple>

#include "etcd_http.h"

namespace kvagent::coord {
namespace {

std::string Text(const Json& j, const char* field) {
  const auto it = j.find(field);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

uint64_t Number(const Json& j, const char* field) {
  const auto it = j.find(field);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

Result<Json> Object(std::string_view json, std::string_view what) {
  Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Internal("the " + std::string(what) + " in etcd is not a JSON object");
  }
  return j;
}

}  // namespace

std::string LeaderRecord::Encode() const {
  Json j{{"name", name}, {"rpc", rpc}, {"events", events}, {"replay", replay}};
  if (!framed.empty()) j["framed"] = framed;
  return j.dump();
}

Result<LeaderRecord> LeaderRecord::Decode(std::string_view json) {
  auto j = Object(json, "leader record");
  if (!j.ok()) return j.status();
  LeaderRecord r;
  r.name = Text(*j, "name");
  r.rpc = Text(*j, "rpc");
  r.events = Text(*j, "events");
  r.replay = Text(*j, "replay");
  r.framed = Text(*j, "framed");
  if (r.name.empty()) return Internal("the leader record in etcd names no member");
  return r;
}

std::string MemberRecord::Encode() const {
  return Json{{"name", name},         {"role", role},
              {"epoch", epoch},       {"applied_seq", applied_seq},
              {"election", election}, {"rpc", rpc}}
      .dump();
}

Result<MemberRecord> MemberRecord::Decode(std::string_view json) {
  auto j = Object(json, "member record");
  if (!j.ok()) return j.status();
  MemberRecord r;
  r.name = Text(*j, "name");
  r.role = Text(*j, "role");
  r.epoch = Number(*j, "epoch");
  r.applied_seq = Number(*j, "applied_seq");
  const auto election = j->find("election");
  r.election = election != j->end() && election->is_number_integer() ? election->get<int64_t>() : 0;
  r.rpc = Text(*j, "rpc");
  if (r.name.empty()) return Internal("a member record in etcd has no name");
  return r;
}

bool BetterPosition(const MemberRecord& a, const MemberRecord& b) {
  // Larger epoch, then larger seq; then the smaller name, so that exactly one member is best.
  return std::tie(a.epoch, a.applied_seq, b.name) > std::tie(b.epoch, b.applied_seq, a.name);
}

}  // namespace kvagent::coord
