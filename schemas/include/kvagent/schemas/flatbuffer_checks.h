// Checks the FlatBuffers Verifier does not make, shared by every reader of untrusted
// FlatBuffers (the agent's ring requests, kvmaster's requests, the agent's master replies).
//
// - Alignment: the Verifier checks that a vector's length field is 4-byte aligned, not that its
//   elements are aligned for their type, so a crafted buffer can put a vector of 8-byte scalars
//   or structs at an address that is 4 mod 8; reading one is undefined behaviour. Readers call
//   ElementsAligned on every such vector (the buffer itself must start 8-byte aligned).
// - Sharing: FlatBuffers lets many offsets point at one string or table, so a small buffer can
//   describe a huge logical message (a batch of 65 536 keys that all name one 4 KiB string).
//   Readers sum the bytes a message refers to (StringBytes, ...) and refuse a message that refers
//   to more bytes than it holds: the work done for a message, and the reply built for it, then
//   stay proportional to its size.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstddef>
#include <cstdint>

namespace kvagent::fbcheck {

// True when `v` is absent, empty (builders need not align an empty vector) or its elements lie
// at addresses aligned for T.
template <typename T>
bool ElementsAligned(const flatbuffers::Vector<T>* v) {
  if (v == nullptr || v->size() == 0) return true;
  return reinterpret_cast<uintptr_t>(v->Data()) % alignof(T) == 0;
}
template <typename T>
bool ElementsAligned(const flatbuffers::Vector<const T*>* v) {
  if (v == nullptr || v->size() == 0) return true;
  return reinterpret_cast<uintptr_t>(v->Data()) % alignof(T) == 0;
}

// Bytes of the strings `v` refers to, each counted once per reference, plus 4 per entry (its
// offset), so that even empty shared strings count.
inline uint64_t StringBytes(
    const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* v) {
  if (v == nullptr) return 0;
  uint64_t total = 0;
  for (const flatbuffers::String* s : *v) total += s->size() + sizeof(flatbuffers::uoffset_t);
  return total;
}

inline uint64_t StringBytes(const flatbuffers::String* s) { return s == nullptr ? 0 : s->size(); }

// Bytes of the elements of `v` (absent: 0).
template <typename T>
uint64_t VectorBytes(const flatbuffers::Vector<T>* v) {
  return v == nullptr ? 0 : uint64_t{v->size()} * sizeof(T);
}
template <typename T>
uint64_t VectorBytes(const flatbuffers::Vector<const T*>* v) {
  return v == nullptr ? 0 : uint64_t{v->size()} * sizeof(T);
}

}  // namespace kvagent::fbcheck
