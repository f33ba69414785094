// kv_result_t: how a Reply is handed to a C caller.
#pragma once

#include "kvagent/client.h"
#include "kvagent/client_c.h"

namespace kvagent::c_abi {

// A new kv_result_t that owns `reply` and points into it (per-key codes and messages, List's
// page, Stat's counters); released by kv_result_free.
kv_result_t* MakeResult(Reply reply);

}  // namespace kvagent::c_abi
