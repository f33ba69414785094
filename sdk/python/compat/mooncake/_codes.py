"""Mooncake's Python return codes, and how kvagent's error codes map onto them.

Mooncake's binding never raises for a runtime failure: every call returns 0 (or a count, a
size, a 0/1 existence flag) on success and a negative ``ErrorCode`` of mooncake-store's
``types.h`` on failure. The values below are those wire values; the mapping from kvagent's
codes (docs/semantics.md) picks the Mooncake code a caller of the real binding would see for the
same situation.
"""
import kvagent

OK = 0
INTERNAL_ERROR = -1
NO_AVAILABLE_HANDLE = -200  # no space in the pool
INVALID_PARAMS = -600  # bad arguments, buffer too small, not set up
REPLICA_IS_NOT_READY = -703
OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706
OBJECT_REPLICA_BUSY = -714
TRANSFER_FAIL = -800
CHECKSUM_MISMATCH = -801
RPC_FAIL = -900  # the node agent (or its master) cannot be reached
RPC_TIMEOUT = -901

_E = kvagent.ErrorCode
_FROM_KVAGENT = {
    _E.OK: OK,
    _E.INVALID_PARAMS: INVALID_PARAMS,
    _E.OBJECT_NOT_FOUND: OBJECT_NOT_FOUND,
    _E.OBJECT_ALREADY_EXISTS: OK,  # put-if-absent: an existing key is a successful put
    _E.REPLICA_NOT_READY: REPLICA_IS_NOT_READY,
    _E.OBJECT_BUSY: OBJECT_REPLICA_BUSY,
    _E.OBJECT_HAS_LEASE: OBJECT_HAS_LEASE,
    _E.NO_SPACE: NO_AVAILABLE_HANDLE,
    _E.BUFFER_OUT_OF_RANGE: INVALID_PARAMS,  # Mooncake: buffer too small is INVALID_PARAMS
    _E.TRANSFER_FAILED: TRANSFER_FAIL,
    _E.TIMEOUT: RPC_TIMEOUT,
    _E.AGENT_UNAVAILABLE: RPC_FAIL,
    _E.MASTER_UNAVAILABLE: RPC_FAIL,
    _E.INTERNAL: INTERNAL_ERROR,
}
_FROM_KVAGENT[_E.DATA_CORRUPTED] = CHECKSUM_MISMATCH  # every replica failed its checksum

# Indexed by kvagent wire value, for the per-key loops.
_TABLE = tuple(_FROM_KVAGENT.get(code, INTERNAL_ERROR) for code in _E)


def from_kvagent(code):
    """The Mooncake return code for a kvagent ErrorCode (or its wire value)."""
    code = int(code)
    return _TABLE[code] if 0 <= code < len(_TABLE) else INTERNAL_ERROR


def codes_of(result):
    """Mooncake codes, one per key, of a kvagent Result (0 where the key succeeded)."""
    table = _TABLE
    last = len(table)
    return [table[c] if 0 <= c < last else INTERNAL_ERROR for c in result.codes]
