// Private to the relay: the check every re-announced object passes before it is published.
#pragma once

#include "kvagent/common/status.h"
#include "kvagent/events/kv_event.h"

namespace kvagent::relay {

// Whether `e` may go on the wire (docs/events.md): session ID and text valid UTF-8 within the
// write-boundary limits, medium non-empty uppercase, token_ids empty or block_size per hash.
// The content comes from the master, which validated it; this is the agent's defence in depth,
// because one bad event makes strict consumers drop the whole batch. An empty session_id is
// normalised to absent (untagged), as the encoder does.
Status CheckAnnouncement(events::BlockStored& e);

}  // namespace kvagent::relay
