#include "announcement.h"

#include "kvagent/common/validate.h"
#include "kvagent/relay/event_relay.h"

namespace kvagent::relay {

events::BlockStored AnnouncementFromKey(std::string_view key, std::string_view session_id) {
  return events::StoredEventFor(key, session_id);
}

Status CheckAnnouncement(events::BlockStored& e) {
  if (e.session_id && e.session_id->empty()) e.session_id.reset();
  if (e.session_id) KVAGENT_RETURN_IF_ERROR(ValidateSessionId(*e.session_id));
  if (e.object_key) KVAGENT_RETURN_IF_ERROR(ValidateKey(*e.object_key, "object_key"));
  if (e.lora_name && !IsValidUtf8(*e.lora_name)) {
    return InvalidParams("lora_name is not valid UTF-8");
  }
  if (e.medium.empty()) return InvalidParams("medium is empty");
  for (char c : e.medium) {
    if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) {
      return InvalidParams("medium \"" + e.medium + "\" is not uppercase ASCII");
    }
  }
  if (!e.token_ids.empty() &&
      e.token_ids.size() != uint64_t{e.block_size} * e.block_hashes.size()) {
    return InvalidParams("token_ids has " + std::to_string(e.token_ids.size()) +
                         " entries, not block_size x hashes = " +
                         std::to_string(uint64_t{e.block_size} * e.block_hashes.size()));
  }
  return Status::Ok();
}

}  // namespace kvagent::relay
