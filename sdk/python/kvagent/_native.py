"""libkvclient.so, loaded with ctypes, and the C declarations of <kvagent/client_c.h>.

The library is looked up, first match wins, in:
  1. the path in the environment variable KVAGENT_LIBKVCLIENT (only there when it is set);
  2. this package's directory (an installed or vendored copy);
  3. the repository's default build directory, build/sdk/c/ (``make build``);
  4. the system loader's path (an installed libkvclient0).
It is loaded on first use, so ``import kvagent`` works without it.
"""
import ctypes
import os
import threading

LIBRARY_ENV = "KVAGENT_LIBKVCLIENT"
SONAME = "libkvclient.so.0"

c_size_t = ctypes.c_size_t
c_uint8 = ctypes.c_uint8
c_uint32 = ctypes.c_uint32
c_uint64 = ctypes.c_uint64
c_void_p = ctypes.c_void_p
c_status = ctypes.c_int  # kv_status_t: a C enum, int-sized


class Bytes(ctypes.Structure):
    """kv_bytes_t: (pointer, length)."""

    _fields_ = [("data", c_void_p), ("size", c_size_t)]


class ConnectOptions(ctypes.Structure):
    """kv_connect_options_t."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("run_dir", ctypes.c_char_p),
        ("client_name", ctypes.c_char_p),
        ("arena_bytes", c_uint64),
        ("ring_bytes", c_uint64),
        ("connect_timeout_ms", c_uint32),
        ("call_timeout_ms", c_uint32),
        ("spin_us", c_uint32),
        ("max_in_flight", c_uint32),
        ("process_memory", c_uint8),
        ("peer_scratch_bytes", c_uint64),
    ]


class WriteOptions(ctypes.Structure):
    """kv_write_options_t."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("timeout_ms", c_uint32),
        ("soft_pin_ttl_ms", c_uint32),
        ("replica_count", c_uint8),
        ("soft_pin", c_uint8),
        ("hard_pin", c_uint8),
    ]


class CallOptions(ctypes.Structure):
    """kv_call_options_t."""

    _fields_ = [("struct_size", c_size_t), ("timeout_ms", c_uint32), ("force", c_uint8)]


class ListOptions(ctypes.Structure):
    """kv_list_options_t."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("prefix", Bytes),
        ("cursor", c_uint64),
        ("limit", c_uint32),
        ("timeout_ms", c_uint32),
    ]


class MemoryRange(ctypes.Structure):
    """kv_memory_range_t: a range of this process's memory."""

    _fields_ = [("data", c_void_p), ("size", c_size_t)]


class Value(ctypes.Structure):
    """kv_value_t: an arena buffer (zero-copy) or bytes to copy."""

    _fields_ = [("buffer", c_void_p), ("bytes", c_void_p), ("size", c_size_t)]


class Block(ctypes.Structure):
    """kv_block_t."""

    _fields_ = [
        ("hashes", ctypes.POINTER(c_uint64)),
        ("hash_count", c_size_t),
        ("token_ids", ctypes.POINTER(c_uint32)),
        ("token_count", c_size_t),
        ("parent_hash", c_uint64),
        ("lora_name", Bytes),
        ("block_size", c_uint32),
        ("hashes_signed", c_uint8),
        ("has_parent", c_uint8),
    ]


class KeyResult(ctypes.Structure):
    """kv_key_result_t."""

    _fields_ = [
        ("code", c_status),
        ("exists", c_uint32),
        ("length", c_uint64),
        ("message", c_void_p),
        ("message_size", c_size_t),
        ("replicas", c_uint32),
    ]


class ListedKey(ctypes.Structure):
    """kv_listed_key_t."""

    _fields_ = [("key", Bytes), ("size", c_uint64), ("session_id", Bytes)]


class Counter(ctypes.Structure):
    """kv_counter_t."""

    _fields_ = [
        ("name", c_void_p),
        ("name_size", c_size_t),
        ("value", c_uint64),
        ("text", c_void_p),
        ("text_size", c_size_t),
    ]


class Result(ctypes.Structure):
    """kv_result_t."""

    _fields_ = [
        ("status", c_status),
        ("message", c_void_p),
        ("message_size", c_size_t),
        ("keys", ctypes.POINTER(KeyResult)),
        ("key_count", c_size_t),
        ("removed_count", c_uint64),
        ("listed", ctypes.POINTER(ListedKey)),
        ("listed_count", c_size_t),
        ("next_cursor", c_uint64),
        ("counters", ctypes.POINTER(Counter)),
        ("counter_count", c_size_t),
        ("internal", c_void_p),
    ]


_P = ctypes.POINTER
_RESULT_OUT = _P(_P(Result))
_HANDLE_OUT = _P(c_void_p)
_WRITE_ARGS = [c_void_p, c_size_t, _P(Bytes), _P(Value), _P(Bytes), _P(Block), _P(WriteOptions)]
_GET_ARGS = [c_void_p, c_size_t, _P(Bytes), _P(c_void_p), _P(CallOptions)]
_KEYED_ARGS = [c_void_p, c_size_t, _P(Bytes), _P(CallOptions)]
_WRITE_FROM_ARGS = [c_void_p, c_size_t, _P(Bytes), _P(MemoryRange), _P(c_size_t), _P(Bytes),
                    _P(Block), _P(WriteOptions)]
_GET_INTO_ARGS = [c_void_p, c_size_t, _P(Bytes), _P(MemoryRange), _P(c_size_t), _P(CallOptions)]

# name: (restype, argtypes)
_FUNCTIONS = {
    "kv_status_name": (ctypes.c_char_p, [c_status]),
    "kv_last_error_message": (ctypes.c_char_p, []),
    "kv_version": (ctypes.c_char_p, []),
    "kv_result_free": (None, [_P(Result)]),
    "kv_connect": (c_status, [_P(ConnectOptions), _HANDLE_OUT]),
    "kv_client_free": (None, [c_void_p]),
    "kv_client_id": (c_uint64, [c_void_p]),
    "kv_client_agent_incarnation": (c_uint64, [c_void_p]),
    "kv_client_agent_epoch": (c_uint64, [c_void_p]),  # deprecated alias of the above
    "kv_client_arena_bytes": (c_uint64, [c_void_p]),
    "kv_client_connected": (ctypes.c_int, [c_void_p]),
    "kv_client_process_memory": (ctypes.c_int, [c_void_p]),
    "kv_allocate": (c_status, [c_void_p, c_size_t, _HANDLE_OUT]),
    "kv_buffer_free": (None, [c_void_p]),
    "kv_buffer_data": (c_void_p, [c_void_p]),
    "kv_buffer_size": (c_size_t, [c_void_p]),
    "kv_ping": (c_status, [c_void_p, c_uint32]),
    "kv_submit_ping": (c_status, [c_void_p, c_uint32, _HANDLE_OUT]),
    "kv_pending_ready": (ctypes.c_int, [c_void_p]),
    "kv_pending_wait": (c_status, [c_void_p, _RESULT_OUT]),
    "kv_pending_free": (None, [c_void_p]),
}

# Each call exists synchronously (kv_<op>, a result out) and asynchronously (kv_submit_<op>).
_CALL_ARGS = {
    "put": _WRITE_ARGS,
    "upsert": _WRITE_ARGS,
    "get": _GET_ARGS,
    "put_from": _WRITE_FROM_ARGS,
    "upsert_from": _WRITE_FROM_ARGS,
    "get_into": _GET_INTO_ARGS,
    "exist": _KEYED_ARGS,
    "remove": _KEYED_ARGS,
    "remove_all": [c_void_p, _P(CallOptions)],
    "list": [c_void_p, _P(ListOptions)],
    "stat": [c_void_p, c_uint32],
}
for _op, _args in _CALL_ARGS.items():
    _FUNCTIONS["kv_" + _op] = (c_status, _args + [_RESULT_OUT])
    _FUNCTIONS["kv_submit_" + _op] = (c_status, _args + [_HANDLE_OUT])

_lock = threading.Lock()
_library = None


def _candidates():
    """The paths to try, in order (see the module docstring)."""
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        return [explicit]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    return [
        os.path.join(here, SONAME),
        os.path.join(repo, "build", "sdk", "c", SONAME),
        SONAME,
    ]


def library():
    """The loaded libkvclient (a ctypes.CDLL with every function declared).

    Raises OSError naming every place tried and what to set when it cannot be found.
    """
    global _library
    with _lock:
        if _library is None:
            _library = _load()
        return _library


def _load():
    """Loads the first candidate that works and declares every function."""
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append("%s (missing)" % path)
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        for name, (restype, argtypes) in _FUNCTIONS.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        return lib
    raise OSError(
        "libkvclient not found; tried: %s. Build it (ninja kvclient) and set %s to the path "
        "of %s" % ("; ".join(tried), LIBRARY_ENV, SONAME))
