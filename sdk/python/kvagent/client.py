"""kvagent.Client and what its calls take and return (over libkvclient's C ABI)."""
import ctypes
import math
import os
import weakref

from . import _native as native
from .errors import ErrorCode, InvalidParams, error_for

_U64_MASK = (1 << 64) - 1
_FIRST_GET_BYTES = 256 << 10  # get_bytes' first buffer when no capacity is given


class Block:
    """Metadata of the KV block(s) one key holds; becomes the key's BlockStored event.

    ``hashes``: at least one block hash, first block first (negative values are allowed with
    ``signed=True``, SGLang-style). ``token_ids``: none, or ``block_size * len(hashes)``.
    ``parent_hash``: the hash of the block before the first, or None. ``lora_name``: str or
    None.
    """

    __slots__ = ("hashes", "token_ids", "block_size", "parent_hash", "lora_name", "signed")

    def __init__(self, hashes, token_ids=(), block_size=0, parent_hash=None, lora_name=None,
                 signed=False):
        self.hashes = list(hashes)
        self.token_ids = list(token_ids)
        self.block_size = block_size
        self.parent_hash = parent_hash
        self.lora_name = lora_name
        self.signed = signed

    def __repr__(self):
        return "Block(hashes=%r, block_size=%r, tokens=%d)" % (
            self.hashes, self.block_size, len(self.token_ids))


class KeyResult:
    """The outcome for one key: ``code`` (ErrorCode), ``message`` (what went wrong and what to
    do; "" when OK), ``length`` (get: the value's length) and ``exists`` (exist: readable)."""

    __slots__ = ("code", "message", "length", "exists")

    def __init__(self, code, message, length=0, exists=False):
        self.code = ErrorCode(code)
        self.message = message
        self.length = length
        self.exists = exists

    @property
    def ok(self):
        """True for OK, and for OBJECT_ALREADY_EXISTS (a put of a stored key succeeds)."""
        return self.code in (ErrorCode.OK, ErrorCode.OBJECT_ALREADY_EXISTS)

    def __repr__(self):
        return "KeyResult(%s%s)" % (self.code.name, ", %r" % self.message if self.message else "")


class Result:
    """The outcome of a call that was attempted: ``keys`` has one KeyResult per key of the
    request, in order; ``removed_count`` is set by remove_all."""

    __slots__ = ("keys", "removed_count")

    def __init__(self, keys, removed_count=0):
        self.keys = keys
        self.removed_count = removed_count

    @property
    def ok(self):
        """True when every key succeeded (see KeyResult.ok)."""
        return all(k.ok for k in self.keys)

    def __len__(self):
        return len(self.keys)

    def __repr__(self):
        return "Result(%r)" % (self.keys,)


class ArenaBuffer:
    """A range of the client's shared-memory data arena (zero-copy put and get).

    ``view()`` is a writable memoryview of it. The memory stays mapped while the buffer or any
    view of it is alive; ``close()`` gives the range back once the last view is gone. A call
    that names the buffer holds it until the call completes, so closing early is safe.
    """

    def __init__(self, lib, handle):
        self._handle = handle
        self._size = lib.kv_buffer_size(handle)
        address = lib.kv_buffer_data(handle)
        # The views' exporter: freeing the C buffer is tied to this array's life, which every
        # memoryview of it extends.
        self._array = (ctypes.c_ubyte * self._size).from_address(address)
        weakref.finalize(self._array, lib.kv_buffer_free, handle)

    @property
    def size(self):
        """The buffer's size in bytes."""
        return self._size

    def __len__(self):
        return self._size

    def view(self):
        """A writable memoryview (format "B") of the whole buffer."""
        return memoryview(self._live()).cast("B")

    def tobytes(self, length=None):
        """A copy of the first ``length`` bytes (default: all)."""
        return bytes(self.view()[: self._size if length is None else length])

    def close(self):
        """Gives the range back to the arena (once no view of it is alive). Idempotent."""
        self._array = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _live(self):
        if self._array is None:
            raise InvalidParams(ErrorCode.INVALID_PARAMS, "this ArenaBuffer is closed")
        return self._array

    def _c_handle(self):
        self._live()
        return self._handle


class PendingCall:
    """A submitted call: ``ready()`` polls, ``wait()`` collects (once) its Result, raising
    KvError when the call failed as a whole. Dropping it without wait() abandons the call."""

    def __init__(self, client, lib, handle, convert):
        self._client = client  # keeps the client open while the call is pending
        self._lib = lib
        self._handle = handle
        self._convert = convert
        self._free = weakref.finalize(self, lib.kv_pending_free, handle)

    def ready(self):
        """True when wait() would return at once. Never blocks."""
        return not self._free.alive or bool(self._lib.kv_pending_ready(self._handle))

    def wait(self):
        """Blocks until the reply arrives or the call's timeout passes; returns what the
        synchronous call returns."""
        if not self._free.alive:
            raise InvalidParams(ErrorCode.INVALID_PARAMS, "wait() was already called; wait once")
        out = ctypes.POINTER(native.Result)()
        code = self._lib.kv_pending_wait(self._handle, ctypes.byref(out))
        self._free()
        return self._convert(_take_result(self._lib, code, out))


def _ms(seconds):
    """Seconds (float or None) as whole milliseconds for the C ABI; None or 0: the default."""
    if seconds is None:
        return 0
    if seconds < 0:
        raise InvalidParams(ErrorCode.INVALID_PARAMS, "timeout is negative; give seconds >= 0")
    return min(max(1, math.ceil(seconds * 1000)) if seconds > 0 else 0, 0xFFFFFFFF)


def _encode(text, what):
    """A key or session ID as bytes: str is UTF-8 encoded, bytes-like passes unchanged (so
    invalid bytes reach the library's own validation)."""
    if isinstance(text, str):
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidParams(ErrorCode.INVALID_PARAMS,
                                "%s is not encodable as UTF-8 (%s)" % (what, e.reason)) from None
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    raise InvalidParams(ErrorCode.INVALID_PARAMS,
                        "%s is a %s; give str or bytes" % (what, type(text).__name__))


def _one_per_key(items, key_count, what, each):
    """``items`` as a list, checked to hold one entry per key."""
    items = list(items)
    if len(items) != key_count:
        raise InvalidParams(ErrorCode.INVALID_PARAMS, "%d %s for %d keys; give %s per key"
                            % (len(items), what, key_count, each))
    return items


def _bytes_array(items, what, keep):
    """A kv_bytes_t array for ``items`` (str or bytes each; None reads as empty)."""
    array = (native.Bytes * len(items))()
    for i, item in enumerate(items):
        data = b"" if item is None else _encode(item, "%s[%d]" % (what, i))
        keep.append(data)
        array[i].data = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p)
        array[i].size = len(data)
    return array


def _value_array(values, keep):
    """A kv_value_t array: ArenaBuffer, (ArenaBuffer, length) or bytes-like each."""
    array = (native.Value * len(values))()
    for i, v in enumerate(values):
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], ArenaBuffer):
            array[i].buffer = v[0]._c_handle()
            array[i].size = v[1]
        elif isinstance(v, ArenaBuffer):
            array[i].buffer = v._c_handle()
            array[i].size = v.size
        else:
            try:
                view = memoryview(v)
            except TypeError:
                raise InvalidParams(
                    ErrorCode.INVALID_PARAMS,
                    "values[%d] is a %s; give an ArenaBuffer, (ArenaBuffer, length) or bytes"
                    % (i, type(v).__name__)) from None
            if view.c_contiguous and not view.readonly:  # bytearray, numpy, ...: no copy
                source = (ctypes.c_char * view.nbytes).from_buffer(view)
                array[i].bytes = ctypes.addressof(source)
            else:
                source = view.tobytes()
                array[i].bytes = ctypes.cast(ctypes.c_char_p(source), ctypes.c_void_p)
            keep.append(source)  # alive until the call is submitted (the library copies it)
            array[i].size = view.nbytes
    return array


def _block_array(blocks, keep):
    """A kv_block_t array; None entries mean "no metadata for this key"."""
    array = (native.Block * len(blocks))()
    for i, b in enumerate(blocks):
        if b is None:
            continue
        hashes = (ctypes.c_uint64 * len(b.hashes))(*[h & _U64_MASK for h in b.hashes])
        tokens = (ctypes.c_uint32 * len(b.token_ids))(*b.token_ids)
        lora = _encode(b.lora_name, "blocks[%d].lora_name" % i) if b.lora_name else b""
        keep.extend((hashes, tokens, lora))
        c = array[i]
        c.hashes, c.hash_count = hashes, len(b.hashes)
        c.token_ids, c.token_count = tokens, len(b.token_ids)
        c.block_size = b.block_size
        c.hashes_signed = 1 if b.signed else 0
        if b.parent_hash is not None:
            c.has_parent, c.parent_hash = 1, b.parent_hash & _U64_MASK
        c.lora_name.data = ctypes.cast(ctypes.c_char_p(lora), ctypes.c_void_p)
        c.lora_name.size = len(lora)
    return array


def _take_result(lib, code, out):
    """Converts and frees a kv_result_t; raises KvError when the call failed as a whole."""
    if not out:
        raise error_for(code, (lib.kv_last_error_message() or b"").decode("utf-8", "replace"))
    try:
        r = out.contents
        keys = [KeyResult(k.code, _text(k.message, k.message_size), k.length, bool(k.exists))
                for k in (r.keys[i] for i in range(r.key_count))]
        result = Result(keys, r.removed_count)
        status, message = r.status, _text(r.message, r.message_size)
    finally:
        lib.kv_result_free(out)
    if status != ErrorCode.OK:
        raise error_for(status, message, result)
    return result


def _text(pointer, size):
    return ctypes.string_at(pointer, size).decode("utf-8", "replace") if size else ""


def _keep_result(result):
    return result


def _nothing(result):
    return None


class Client:
    """A connection to the node agent at ``<run_dir>/agent.sock`` over shared memory.

    ``name`` shows in the agent's logs (default "<program>:<pid>"); ``arena_bytes`` is the
    data arena wanted (the agent may grant less: see ``arena_bytes`` afterwards). Timeouts are
    in seconds; ``call_timeout`` applies to calls that give none. Raises AgentUnavailable when
    no agent listens or it refuses the client, Timeout when it does not answer in
    ``connect_timeout``. A Client may be shared by threads (calls release the GIL while they
    wait); ``close()`` it (or use ``with``) when done.
    """

    def __init__(self, run_dir="/run/kvagent", name=None, arena_bytes=64 << 20, *,
                 ring_bytes=0, connect_timeout=5.0, call_timeout=30.0, spin_us=50,
                 max_in_flight=0):
        lib = native.library()
        options = native.ConnectOptions(
            struct_size=ctypes.sizeof(native.ConnectOptions),
            run_dir=os.fsencode(run_dir),
            client_name=_encode(name, "name") if name else None,
            arena_bytes=arena_bytes, ring_bytes=ring_bytes,
            connect_timeout_ms=_ms(connect_timeout), call_timeout_ms=_ms(call_timeout),
            spin_us=spin_us, max_in_flight=max_in_flight)
        handle = ctypes.c_void_p()
        code = lib.kv_connect(ctypes.byref(options), ctypes.byref(handle))
        if code != ErrorCode.OK:
            raise error_for(code, lib.kv_last_error_message().decode("utf-8", "replace"))
        self._lib = lib
        self._handle = handle.value
        self._free = weakref.finalize(self, lib.kv_client_free, self._handle)

    # ---- lifetime ------------------------------------------------------------------------

    def close(self):
        """Disconnects (pending calls fail with AGENT_UNAVAILABLE). ArenaBuffers stay usable
        as memory until closed. Idempotent; no other call may run on this client meanwhile."""
        self._free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _h(self):
        if not self._free.alive:
            raise InvalidParams(ErrorCode.INVALID_PARAMS, "this Client is closed")
        return self._handle

    # ---- facts ---------------------------------------------------------------------------

    @property
    def client_id(self):
        """The id the agent gave this client."""
        return self._lib.kv_client_id(self._h())

    @property
    def agent_epoch(self):
        """The agent's epoch (changes when the agent restarts)."""
        return self._lib.kv_client_agent_epoch(self._h())

    @property
    def arena_bytes(self):
        """The arena size the agent granted."""
        return self._lib.kv_client_arena_bytes(self._h())

    @property
    def connected(self):
        """False once the agent is known to be gone (every call then raises
        AgentUnavailable)."""
        return self._free.alive and bool(self._lib.kv_client_connected(self._handle))

    # ---- buffers ---------------------------------------------------------------------------

    def allocate(self, size):
        """A new ArenaBuffer of ``size`` bytes. Raises NoSpace (the message gives the largest
        free extent) or InvalidParams (size 0)."""
        handle = ctypes.c_void_p()
        code = self._lib.kv_allocate(self._h(), size, ctypes.byref(handle))
        if code != ErrorCode.OK:
            raise error_for(code, self._lib.kv_last_error_message().decode("utf-8", "replace"))
        return ArenaBuffer(self._lib, handle.value)

    # ---- calls -----------------------------------------------------------------------------

    def ping(self, timeout=None):
        """A round trip to the agent. Returns None; raises KvError on failure."""
        self._sync(self._submit_ping(timeout), _nothing)

    def put(self, keys, values, session_ids=None, blocks=None, **write):
        """Stores new objects; a key already stored answers OBJECT_ALREADY_EXISTS (ok).

        ``keys``: str or bytes each. ``values``: ArenaBuffer (zero-copy, whole buffer),
        (ArenaBuffer, length), or bytes-like (copied). ``session_ids``: one per key (str,
        bytes, or None/"" for untagged) or None. ``blocks``: one Block or None per key, or
        None. ``write``: replica_count=1, soft_pin=False, soft_pin_ttl_ms=0, hard_pin=False,
        timeout=None. Returns a Result; raises KvError when the call failed as a whole.
        """
        return self._sync(self._submit_write("kv_submit_put", keys, values, session_ids, blocks,
                                             **write), _keep_result)

    def upsert(self, keys, values, session_ids=None, blocks=None, **write):
        """Stores or replaces objects; arguments as for put()."""
        return self._sync(self._submit_write("kv_submit_upsert", keys, values, session_ids,
                                             blocks, **write), _keep_result)

    def get(self, keys, buffers, timeout=None):
        """Reads each key's value into the matching ArenaBuffer (zero-copy); the value's length
        is ``result.keys[i].length``."""
        return self._sync(self._submit_get(keys, buffers, timeout), _keep_result)

    def get_bytes(self, key, capacity=None, timeout=None):
        """Convenience for one key: allocates a buffer, gets into it and returns a copy of the
        value as bytes. ``capacity``: the largest value expected; without it a first try uses
        256 KiB (or the arena, if smaller) and a larger value is fetched again at its exact
        length. Raises the KvError of the key's code when the key could not be read (there is
        no Result to carry it)."""
        size = capacity if capacity is not None else min(_FIRST_GET_BYTES, self.arena_bytes)
        while True:
            with self.allocate(size) as buffer:
                k = self.get([key], [buffer], timeout).keys[0]
                if k.code == ErrorCode.OK:
                    return buffer.tobytes(k.length)
            if (k.code != ErrorCode.BUFFER_OUT_OF_RANGE or capacity is not None
                    or k.length <= size):
                raise error_for(k.code, k.message)
            size = k.length  # the value is larger than the first try: once more, exactly

    def exist(self, keys, timeout=None):
        """``result.keys[i].exists`` tells whether each object is readable."""
        return self._sync(self._submit_keyed("kv_submit_exist", keys, timeout, False),
                          _keep_result)

    def remove(self, keys, force=False, timeout=None):
        """Removes the objects; leased ones only with ``force=True``."""
        return self._sync(self._submit_keyed("kv_submit_remove", keys, timeout, force),
                          _keep_result)

    def remove_all(self, force=False, timeout=None):
        """Removes every object in the store; ``result.removed_count`` says how many."""
        return self._sync(self._submit_keyed("kv_submit_remove_all", None, timeout, force),
                          _keep_result)

    # ---- asynchronous forms -----------------------------------------------------------------

    def submit_ping(self, timeout=None):
        """ping(), submitted now; collect with PendingCall.wait()."""
        return self._submit_ping(timeout)

    def submit_put(self, keys, values, session_ids=None, blocks=None, **write):
        """put(), submitted now; collect with PendingCall.wait()."""
        return self._submit_write("kv_submit_put", keys, values, session_ids, blocks, **write)

    def submit_upsert(self, keys, values, session_ids=None, blocks=None, **write):
        """upsert(), submitted now; collect with PendingCall.wait()."""
        return self._submit_write("kv_submit_upsert", keys, values, session_ids, blocks, **write)

    def submit_get(self, keys, buffers, timeout=None):
        """get(), submitted now; the buffers are held until the call completes."""
        return self._submit_get(keys, buffers, timeout)

    def submit_exist(self, keys, timeout=None):
        """exist(), submitted now."""
        return self._submit_keyed("kv_submit_exist", keys, timeout, False)

    def submit_remove(self, keys, force=False, timeout=None):
        """remove(), submitted now."""
        return self._submit_keyed("kv_submit_remove", keys, timeout, force)

    def submit_remove_all(self, force=False, timeout=None):
        """remove_all(), submitted now."""
        return self._submit_keyed("kv_submit_remove_all", None, timeout, force)

    # ---- plumbing ------------------------------------------------------------------------------

    @staticmethod
    def _sync(pending, convert):
        pending._convert = convert
        return pending.wait()

    def _pending(self, code, handle):
        if code != ErrorCode.OK:  # only a NULL argument or out of memory: nothing was submitted
            raise error_for(code, self._lib.kv_last_error_message().decode("utf-8", "replace"))
        return PendingCall(self, self._lib, handle.value, _keep_result)

    def _submit_ping(self, timeout):
        handle = ctypes.c_void_p()
        code = self._lib.kv_submit_ping(self._h(), _ms(timeout), ctypes.byref(handle))
        pending = self._pending(code, handle)
        pending._convert = _nothing
        return pending

    def _submit_write(self, function, keys, values, session_ids, blocks, replica_count=1,
                      soft_pin=False, soft_pin_ttl_ms=0, hard_pin=False, timeout=None):
        keys = list(keys)
        values = _one_per_key(values, len(keys), "values", "one value")
        keep = []
        c_keys = _bytes_array(keys, "keys", keep)
        c_values = _value_array(values, keep)
        c_sessions = None
        if session_ids is not None:
            session_ids = _one_per_key(session_ids, len(keys), "session_ids",
                                       "one session ID (None or \"\" for untagged)")
            c_sessions = _bytes_array(session_ids, "session_ids", keep)
        c_blocks = None
        if blocks is not None:
            blocks = _one_per_key(blocks, len(keys), "blocks", "one Block or None")
            c_blocks = _block_array(blocks, keep)
        options = native.WriteOptions(
            struct_size=ctypes.sizeof(native.WriteOptions), timeout_ms=_ms(timeout),
            soft_pin_ttl_ms=soft_pin_ttl_ms, replica_count=replica_count,
            soft_pin=1 if soft_pin else 0, hard_pin=1 if hard_pin else 0)
        handle = ctypes.c_void_p()
        code = getattr(self._lib, function)(self._h(), len(keys), c_keys, c_values, c_sessions,
                                            c_blocks, ctypes.byref(options), ctypes.byref(handle))
        return self._pending(code, handle)

    def _submit_get(self, keys, buffers, timeout):
        keys = list(keys)
        buffers = _one_per_key(buffers, len(keys), "buffers", "one ArenaBuffer")
        keep = []
        c_keys = _bytes_array(keys, "keys", keep)
        c_buffers = (ctypes.c_void_p * len(buffers))()
        for i, b in enumerate(buffers):
            if not isinstance(b, ArenaBuffer):
                raise InvalidParams(ErrorCode.INVALID_PARAMS,
                                    "buffers[%d] is a %s; allocate one with Client.allocate"
                                    % (i, type(b).__name__))
            c_buffers[i] = b._c_handle()
        options = self._call_options(timeout, False)
        handle = ctypes.c_void_p()
        code = self._lib.kv_submit_get(self._h(), len(keys), c_keys, c_buffers,
                                       ctypes.byref(options), ctypes.byref(handle))
        return self._pending(code, handle)

    def _submit_keyed(self, function, keys, timeout, force):
        options = self._call_options(timeout, force)
        handle = ctypes.c_void_p()
        if keys is None:  # remove_all
            code = getattr(self._lib, function)(self._h(), ctypes.byref(options),
                                                ctypes.byref(handle))
        else:
            keys = list(keys)
            keep = []
            c_keys = _bytes_array(keys, "keys", keep)
            code = getattr(self._lib, function)(self._h(), len(keys), c_keys,
                                                ctypes.byref(options), ctypes.byref(handle))
        return self._pending(code, handle)

    @staticmethod
    def _call_options(timeout, force):
        return native.CallOptions(struct_size=ctypes.sizeof(native.CallOptions),
                                  timeout_ms=_ms(timeout), force=1 if force else 0)
