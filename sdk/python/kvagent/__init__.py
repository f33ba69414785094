"""kvagent: the Python SDK of the kvagent node agent (a distributed LLM KV-cache store).

    import kvagent
    c = kvagent.Client(run_dir="/run/kvagent", name="vllm-0", arena_bytes=64 << 20)
    buf = c.allocate(4096)                 # a range of the shared-memory arena
    buf.view()[:5] = b"hello"              # fill it in place: put is then zero-copy
    r = c.put(["k1", "k2"], [buf, b"raw bytes"], session_ids=["s1", "会话"],
              blocks=[kvagent.Block(hashes=[1], token_ids=list(range(16)), block_size=16),
                      None])
    r.ok, r.keys[0].code, r.keys[0].message
    data = c.get_bytes("k1")               # allocate, get, copy out
    c.get(["k1"], [buf])                   # zero-copy into an arena buffer; r.keys[0].length
    c.exist(["k1"]); c.remove(["k1"], force=False); c.remove_all()
    for k in c.iter_keys(prefix="k"): k.key, k.size, k.session_id   # List, paged
    c.stat()["agent.keys.put"]             # the agent's and the master's counters
    p = c.submit_put(["k3"], [b"v"]); p.wait()   # asynchronous: submit now, collect later

The error rule:
  * A call that fails as a whole raises ``kvagent.KvError`` (code and message), as a subclass
    per code: ``InvalidParams`` (arguments break the rules; found locally, without a round trip
    to the agent), ``AgentUnavailable`` (no agent, or it went away), ``MasterUnavailable``,
    ``Timeout``, ``NoSpace``, ... The exception's ``result`` holds the per-key view.
  * A call that was attempted returns a ``Result`` and raises nothing, even when some keys
    failed: each ``result.keys[i]`` has a ``code`` (``kvagent.ErrorCode``, named as in
    docs/semantics.md) and a ``message`` that says what to do. ``KeyResult.ok`` (and ``Result.ok``
    for all keys) counts OBJECT_ALREADY_EXISTS from a put as success.
  * ``get_bytes``, which returns bytes and no Result, raises the key's error instead.

Keys and session IDs are ``str`` (UTF-8 encoded) or ``bytes`` (passed as they are, so the
library's own validation judges them). Timeouts are in seconds. The package uses ctypes over
libkvclient.so (the SDK's C ABI, <kvagent/client_c.h>); where it is looked up is described in
``kvagent._native`` (set ``KVAGENT_LIBKVCLIENT`` to its path to choose).
"""
from .client import ArenaBuffer, Client, PendingCall
from .records import Block, KeyResult, ListedKey, ListPage, Result
from .errors import (AgentUnavailable, BufferOutOfRange, DataCorrupted, ErrorCode, InternalError,
                     InvalidParams, KvError, MasterUnavailable, NoSpace, ObjectAlreadyExists,
                     ObjectBusy, ObjectHasLease, ObjectNotFound, ReplicaNotReady, Timeout,
                     TransferFailed)


def library_version():
    """The version of the loaded libkvclient ("MAJOR.MINOR.PATCH")."""
    from . import _native
    return _native.library().kv_version().decode()


__all__ = [
    "AgentUnavailable", "ArenaBuffer", "Block", "BufferOutOfRange", "Client", "DataCorrupted",
    "ErrorCode",
    "InternalError", "InvalidParams", "KeyResult", "KvError", "ListedKey", "ListPage",
    "MasterUnavailable", "NoSpace",
    "ObjectAlreadyExists", "ObjectBusy", "ObjectHasLease", "ObjectNotFound", "PendingCall",
    "ReplicaNotReady", "Result", "Timeout", "TransferFailed", "library_version",
]
