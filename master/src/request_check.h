// The shape of a master.fbs Request, checked after the FlatBuffers Verifier and before
// MasterRpc reads anything: what the Verifier leaves to the reader.
//
// - the body: a body_type that names a table must come with that table (the Verifier accepts a
//   Request whose body is absent, and body_as_X() then returns null);
// - the vectors a handler reads: present where it needs them; vectors of 8-byte scalars and
//   structs (sizes, block hashes) aligned for their type (the Verifier checks 4 bytes only);
// - the request's logical size: the strings and vectors it refers to, each counted once per
//   reference, may not exceed the request's own bytes. FlatBuffers lets every key of a batch
//   point at one shared string; such a request would make the master validate, look up and
//   answer (its per-key messages name the key) far more bytes than it received. Builders that
//   write each key once (every kvagent does) never share.
//
// A request that fails gets INVALID_PARAMS with a message naming the field, is counted as a bad
// request, and changes nothing. Body types this build does not know pass unchanged (MasterRpc
// answers them "unknown request type").
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvagent/common/status.h"
#include "kvagent/schemas/master_generated.h"

namespace kvagent::master {

// `request` verified by the FlatBuffers Verifier, over a buffer of `request_bytes` bytes that
// starts 8-byte aligned.
Status CheckRequestShape(const master_proto::Request& request, size_t request_bytes);

}  // namespace kvagent::master
