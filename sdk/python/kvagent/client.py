"""kvagent.Client and what its calls take and return (over libkvclient's C ABI)."""
import ctypes
import math
import os
import weakref

from . import _marshal as marshal
from . import _native as native
from .errors import ErrorCode, error_for
from .records import ListedKey, ListPage, Result

_FIRST_GET_BYTES = 256 << 10  # get_bytes' first buffer when no capacity is given
_OK = int(ErrorCode.OK)


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

    @property
    def address(self):
        """The address of the buffer's first byte (for ctypes.memmove and C code); valid while
        the buffer is open. Raises InvalidParams once closed."""
        return ctypes.addressof(self._live())

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
        """The memory array; raises InvalidParams once closed."""
        if self._array is None:
            raise marshal.invalid("this ArenaBuffer is closed")
        return self._array

    def _c_handle(self):
        """The kv_buffer_t* for a call; raises InvalidParams once closed."""
        self._live()
        return self._handle


class PendingCall:
    """A submitted call: ``ready()`` polls, ``wait()`` collects (once) its Result, raising
    KvError when the call failed as a whole. Dropping it without wait() abandons the call (the
    buffers it names stay reserved until its reply arrives)."""

    def __init__(self, client, handle, make):
        self._client = client  # keeps the client open while the call is pending
        self._lib = client._lib
        self._handle = handle
        self._make = make
        self._free = weakref.finalize(self, self._lib.kv_pending_free, handle)

    def ready(self):
        """True when wait() would return at once. Never blocks."""
        return not self._free.alive or bool(self._lib.kv_pending_ready(self._handle))

    def wait(self):
        """Blocks until the reply arrives or the call's timeout passes; returns what the
        synchronous call returns."""
        if not self._free.alive:
            raise marshal.invalid("wait() was already called; wait once")
        out = ctypes.POINTER(native.Result)()
        code = self._lib.kv_pending_wait(self._handle, ctypes.byref(out))
        self._free()
        return marshal.take_result(self._lib, code, out, self._make)


def _ms(seconds):
    """Seconds (float or None) as whole milliseconds for the C ABI; None or 0: the default."""
    if seconds is None:
        return 0
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise marshal.invalid("timeout is a %s; give seconds as a number" % type(seconds).__name__)
    if not math.isfinite(seconds):
        raise marshal.invalid("timeout is %r; give a finite number of seconds >= 0 (None: the "
                              "default)" % seconds)
    if seconds < 0:
        raise marshal.invalid("timeout is negative; give seconds >= 0")
    return min(max(1, math.ceil(seconds * 1000)) if seconds > 0 else 0, 0xFFFFFFFF)


# What a call returns, built from its kv_result_t (see marshal.take_result).
def _keyed(r):
    """A Result (per-key outcomes, removed_count)."""
    rows, messages = marshal.key_rows(r)
    return Result(rows, messages, r.removed_count)


def _nothing(r):
    """None: the call returns nothing but its success."""
    return None


def _page(r):
    """A ListPage."""
    return ListPage([ListedKey(*e) for e in marshal.listed(r)], r.next_cursor)


def _counters(r):
    """Stat's {name: value or text}."""
    return marshal.counters(r)


def _call_options(timeout, force):
    """A kv_call_options_t, or None (NULL: the library's defaults) when nothing is set."""
    if timeout is None and not force:
        return None
    return ctypes.byref(native.CallOptions(struct_size=ctypes.sizeof(native.CallOptions),
                                           timeout_ms=_ms(timeout), force=1 if force else 0))


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
                 max_in_flight=0, process_memory=False, peer_scratch_bytes=0):
        lib = native.library()
        options = native.ConnectOptions(
            struct_size=ctypes.sizeof(native.ConnectOptions),
            run_dir=os.fsencode(run_dir),
            client_name=marshal.encode(name, "name") if name else None,
            arena_bytes=marshal.unsigned(arena_bytes, 64, "arena_bytes"),
            ring_bytes=marshal.unsigned(ring_bytes, 64, "ring_bytes"),
            connect_timeout_ms=_ms(connect_timeout), call_timeout_ms=_ms(call_timeout),
            spin_us=marshal.unsigned(spin_us, 32, "spin_us"),
            max_in_flight=marshal.unsigned(max_in_flight, 32, "max_in_flight"),
            process_memory=1 if process_memory else 0,
            peer_scratch_bytes=marshal.unsigned(peer_scratch_bytes, 64, "peer_scratch_bytes"))
        handle = ctypes.c_void_p()
        code = lib.kv_connect(ctypes.byref(options), ctypes.byref(handle))
        if code != ErrorCode.OK:
            raise marshal.last_error(lib, code)
        self._lib = lib
        self._handle = handle.value
        self._free = weakref.finalize(self, lib.kv_client_free, self._handle)

    # ---- lifetime ------------------------------------------------------------------------

    def close(self):
        """Disconnects (pending calls fail with AGENT_UNAVAILABLE). ArenaBuffers stay usable
        as memory until closed. Idempotent; no other call may run on this client meanwhile."""
        self._handle = None
        self._free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _h(self):
        """The kv_client_t*; raises InvalidParams once closed."""
        handle = self._handle
        if handle is None:
            raise marshal.invalid("this Client is closed")
        return handle

    # ---- facts ---------------------------------------------------------------------------

    @property
    def client_id(self):
        """The id the agent gave this client."""
        return self._lib.kv_client_id(self._h())

    @property
    def agent_incarnation(self):
        """The agent's incarnation (drawn anew when the agent restarts)."""
        return self._lib.kv_client_agent_incarnation(self._h())

    @property
    def agent_epoch(self):
        """Deprecated: the former name of agent_incarnation, the same value."""
        return self._lib.kv_client_agent_epoch(self._h())

    @property
    def arena_bytes(self):
        """The arena size the agent granted."""
        return self._lib.kv_client_arena_bytes(self._h())

    @property
    def process_memory(self):
        """True when the agent reads and writes this process's memory directly (asked with
        process_memory=True and granted at connect): put_from/get_into then copy once, straight
        between this process and the node pool."""
        return self._handle is not None and bool(self._lib.kv_client_process_memory(self._handle))

    @property
    def connected(self):
        """False once the agent is known to be gone (every call then raises
        AgentUnavailable)."""
        return self._handle is not None and bool(self._lib.kv_client_connected(self._handle))

    # ---- buffers ---------------------------------------------------------------------------

    def allocate(self, size):
        """A new ArenaBuffer of ``size`` bytes. Raises NoSpace (the message gives the largest
        free extent) or InvalidParams (size 0)."""
        handle = ctypes.c_void_p()
        code = self._lib.kv_allocate(self._h(), marshal.unsigned(size, 64, "size"),
                                     ctypes.byref(handle))
        if code != ErrorCode.OK:
            raise marshal.last_error(self._lib, code)
        return ArenaBuffer(self._lib, handle.value)

    # ---- calls -----------------------------------------------------------------------------

    def ping(self, timeout=None):
        """A round trip to the agent. Returns None; raises KvError on failure."""
        code = self._lib.kv_ping(self._h(), _ms(timeout) if timeout is not None else 0)
        if code != _OK:
            raise marshal.last_error(self._lib, code)

    def put(self, keys, values, session_ids=None, blocks=None, **write):
        """Stores new objects; a key already stored answers OBJECT_ALREADY_EXISTS (ok).

        ``keys``: str or bytes each. ``values``: ArenaBuffer (zero-copy, whole buffer),
        (ArenaBuffer, length), or bytes-like (copied). ``session_ids``: one per key (str,
        bytes, or None/"" for untagged) or None. ``blocks``: one Block or None per key, or
        None. ``write``: replica_count=1, soft_pin=False, soft_pin_ttl_ms=0, hard_pin=False,
        timeout=None. Returns a Result; raises KvError when the call failed as a whole.
        """
        return self._call(self._lib.kv_put,
                          *self._write_args(keys, values, session_ids, blocks, **write))

    def upsert(self, keys, values, session_ids=None, blocks=None, **write):
        """Stores or replaces objects; arguments as for put()."""
        return self._call(self._lib.kv_upsert,
                          *self._write_args(keys, values, session_ids, blocks, **write))

    def get(self, keys, buffers, timeout=None):
        """Reads each key's value into the matching ArenaBuffer (zero-copy); the value's length
        is ``result.keys[i].length`` (with BUFFER_OUT_OF_RANGE when the buffer is smaller)."""
        return self._call(self._lib.kv_get, *self._get_args(keys, buffers, timeout))

    def put_from(self, keys, sources, session_ids=None, blocks=None, **write):
        """put() with each value in this process's memory: ``sources`` has one (address, size)
        pair per key, or a list of pairs whose bytes are gathered in order. With process memory
        the agent reads them directly; otherwise the library copies them into the arena first.
        A range the agent cannot read fails its key with INVALID_PARAMS."""
        return self._call(self._lib.kv_put_from,
                          *self._write_from_args(keys, sources, session_ids, blocks, **write))

    def upsert_from(self, keys, sources, session_ids=None, blocks=None, **write):
        """upsert() with values in this process's memory (as put_from)."""
        return self._call(self._lib.kv_upsert_from,
                          *self._write_from_args(keys, sources, session_ids, blocks, **write))

    def get_into(self, keys, targets, timeout=None):
        """get() into this process's memory: ``targets`` has one (address, capacity) pair per
        key, or a list of pairs filled in order. ``result.keys[i].length`` is the value's
        length (BUFFER_OUT_OF_RANGE when it exceeds the capacity). The memory must not be read
        or written by anyone else until the call returns."""
        return self._call(self._lib.kv_get_into, *self._get_into_args(keys, targets, timeout))

    def submit_put_from(self, keys, sources, session_ids=None, blocks=None, **write):
        """put_from(), submitted now; the memory must stay valid until wait() returns."""
        return self._submit(self._lib.kv_submit_put_from,
                            *self._write_from_args(keys, sources, session_ids, blocks, **write))

    def submit_get_into(self, keys, targets, timeout=None):
        """get_into(), submitted now; the memory is written until wait() returns."""
        return self._submit(self._lib.kv_submit_get_into,
                            *self._get_into_args(keys, targets, timeout))

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
        return self._call(self._lib.kv_exist, *self._keyed_args(keys, timeout, False))

    def remove(self, keys, force=False, timeout=None):
        """Removes the objects; leased ones only with ``force=True``."""
        return self._call(self._lib.kv_remove, *self._keyed_args(keys, timeout, force))

    def remove_all(self, force=False, timeout=None):
        """Removes every object in the store; ``result.removed_count`` says how many."""
        return self._call(self._lib.kv_remove_all, (_call_options(timeout, force),))

    def list(self, prefix="", cursor=0, limit=1000, timeout=None):
        """One page of the stored keys that start with ``prefix`` (a ListPage). Start with
        cursor 0 and pass each page's next_cursor until it is 0: every key present during the
        whole scan is listed exactly once; a page may be shorter or somewhat longer than
        ``limit`` (at most 10000), and may be empty before the scan ends."""
        return self._call(self._lib.kv_list, *self._list_args(prefix, cursor, limit, timeout),
                          make=_page)

    def iter_keys(self, prefix="", limit=1000, timeout=None):
        """Every stored key that starts with ``prefix`` (ListedKey each), paging with list()."""
        cursor = 0
        while True:
            page = self.list(prefix, cursor, limit, timeout)
            yield from page.keys
            cursor = page.next_cursor
            if cursor == 0:
                return

    def stat(self, timeout=None):
        """The agent's counters ("agent.*") and its master's ("master.*"): {name: value}, or
        {name: text} for the few whose value is a word (e.g. "agent.master_link")."""
        return self._call(self._lib.kv_stat, (_ms(timeout),), make=_counters)

    # ---- asynchronous forms -----------------------------------------------------------------

    def submit_ping(self, timeout=None):
        """ping(), submitted now; collect with PendingCall.wait() (returns None)."""
        return self._submit(self._lib.kv_submit_ping, (_ms(timeout),), make=_nothing)

    def submit_put(self, keys, values, session_ids=None, blocks=None, **write):
        """put(), submitted now; collect with PendingCall.wait()."""
        return self._submit(self._lib.kv_submit_put,
                            *self._write_args(keys, values, session_ids, blocks, **write))

    def submit_upsert(self, keys, values, session_ids=None, blocks=None, **write):
        """upsert(), submitted now; collect with PendingCall.wait()."""
        return self._submit(self._lib.kv_submit_upsert,
                            *self._write_args(keys, values, session_ids, blocks, **write))

    def submit_get(self, keys, buffers, timeout=None):
        """get(), submitted now; the buffers are held until the call completes."""
        return self._submit(self._lib.kv_submit_get, *self._get_args(keys, buffers, timeout))

    def submit_exist(self, keys, timeout=None):
        """exist(), submitted now."""
        return self._submit(self._lib.kv_submit_exist, *self._keyed_args(keys, timeout, False))

    def submit_remove(self, keys, force=False, timeout=None):
        """remove(), submitted now."""
        return self._submit(self._lib.kv_submit_remove, *self._keyed_args(keys, timeout, force))

    def submit_remove_all(self, force=False, timeout=None):
        """remove_all(), submitted now."""
        return self._submit(self._lib.kv_submit_remove_all, (_call_options(timeout, force),))

    def submit_list(self, prefix="", cursor=0, limit=1000, timeout=None):
        """list(), submitted now; wait() returns the ListPage."""
        return self._submit(self._lib.kv_submit_list,
                            *self._list_args(prefix, cursor, limit, timeout), make=_page)

    def submit_stat(self, timeout=None):
        """stat(), submitted now; wait() returns the counters."""
        return self._submit(self._lib.kv_submit_stat, (_ms(timeout),), make=_counters)

    # ---- plumbing ------------------------------------------------------------------------------
    # The *_args methods return (the C arguments after the client handle, what they point
    # into); the second must live until the C function returns, which is all it needs: the
    # library copies what a call uses before kv_submit_* or a synchronous call returns.

    def _call(self, function, args, keep=(), make=_keyed):
        """Runs a synchronous C call and returns make(its kv_result_t), or raises."""
        out = ctypes.POINTER(native.Result)()
        code = function(self._h(), *args, ctypes.byref(out))
        del keep
        return marshal.take_result(self._lib, code, out, make)

    def _submit(self, function, args, keep=(), make=_keyed):
        """Runs a kv_submit_* function; the PendingCall's wait() returns make(kv_result_t)."""
        handle = ctypes.c_void_p()
        code = function(self._h(), *args, ctypes.byref(handle))
        del keep
        if code != _OK:  # only a NULL argument or out of memory: nothing was submitted
            raise marshal.last_error(self._lib, code)
        return PendingCall(self, handle.value, make)

    def _list_args(self, prefix, cursor, limit, timeout):
        """kv_list's arguments: a kv_list_options_t."""
        encoded = marshal.encode(prefix, "prefix")
        options = native.ListOptions(struct_size=ctypes.sizeof(native.ListOptions),
                                     cursor=marshal.unsigned(cursor, 64, "cursor"),
                                     limit=marshal.unsigned(limit, 32, "limit"),
                                     timeout_ms=_ms(timeout))
        options.prefix.data = ctypes.cast(ctypes.c_char_p(encoded), ctypes.c_void_p)
        options.prefix.size = len(encoded)
        return (ctypes.byref(options),), (encoded, options)

    def _keyed_args(self, keys, timeout, force):
        """Exist/Remove arguments: count, kv_bytes_t keys, kv_call_options_t."""
        keep = []
        encoded = marshal.encode_all(keys, "keys")
        return (len(encoded), marshal.bytes_array(encoded, keep),
                _call_options(timeout, force)), keep

    def _get_args(self, keys, buffers, timeout):
        """Get arguments: count, keys, kv_buffer_t* per key, kv_call_options_t."""
        keep = []
        encoded = marshal.encode_all(keys, "keys")
        buffers = marshal.one_per_key(buffers, len(encoded), "buffers", "one ArenaBuffer")
        # Fast path for the common case (open ArenaBuffers); the loop below names the culprit.
        if all(type(b) is ArenaBuffer and b._array is not None for b in buffers):
            handles = [b._handle for b in buffers]
        else:
            handles = []
            for i, b in enumerate(buffers):
                if not isinstance(b, ArenaBuffer):
                    raise marshal.invalid("buffers[%d] is a %s; allocate one with "
                                          "Client.allocate" % (i, type(b).__name__))
                handles.append(b._c_handle())
        c_buffers = marshal.pointer_array(handles, keep)
        return (len(encoded), marshal.bytes_array(encoded, keep), c_buffers,
                _call_options(timeout, False)), keep

    def _get_into_args(self, keys, targets, timeout):
        """kv_get_into arguments: count, keys, ranges, range counts, kv_call_options_t."""
        keep = []
        encoded = marshal.encode_all(keys, "keys")
        ranges, counts = marshal.memory_arrays(targets, len(encoded), "targets", keep)
        return (len(encoded), marshal.bytes_array(encoded, keep), ranges, counts,
                _call_options(timeout, False)), keep

    def _write_from_args(self, keys, sources, session_ids, blocks, **write):
        """kv_put_from arguments: _write_args with the values as memory ranges."""
        (n, c_keys, _values, c_sessions, c_blocks, options), keep = self._write_args(
            keys, None, session_ids, blocks, **write)
        ranges, counts = marshal.memory_arrays(sources, n, "sources", keep)
        return (n, c_keys, ranges, counts, c_sessions, c_blocks, options), keep

    def _write_args(self, keys, values, session_ids, blocks, replica_count=1, soft_pin=False,
                    soft_pin_ttl_ms=0, hard_pin=False, timeout=None):
        """Put/Upsert arguments: count, keys, values, session IDs, blocks, kv_write_options_t
        (NULL when every write option is the default)."""
        keep = []
        encoded = marshal.encode_all(keys, "keys")
        n = len(encoded)
        if values is not None:
            values = marshal.one_per_key(values, n, "values", "one value")
        c_sessions = c_blocks = options = None
        if session_ids is not None:
            sessions = marshal.one_per_key(session_ids, n, "session_ids",
                                           "one session ID (None or \"\" for untagged)")
            c_sessions = marshal.bytes_array(marshal.encode_all(sessions, "session_ids"), keep)
        if blocks is not None:
            blocks = marshal.one_per_key(blocks, n, "blocks", "one Block or None")
            c_blocks = marshal.block_array(blocks, keep)
        if (replica_count, soft_pin, soft_pin_ttl_ms, hard_pin, timeout) != (1, False, 0, False,
                                                                             None):
            options = ctypes.byref(native.WriteOptions(
                struct_size=ctypes.sizeof(native.WriteOptions), timeout_ms=_ms(timeout),
                soft_pin_ttl_ms=marshal.unsigned(soft_pin_ttl_ms, 32, "soft_pin_ttl_ms"),
                replica_count=marshal.unsigned(replica_count, 8, "replica_count", low=1),
                soft_pin=1 if soft_pin else 0, hard_pin=1 if hard_pin else 0))
        c_values = None if values is None else marshal.value_array(values, ArenaBuffer, keep)
        return (n, marshal.bytes_array(encoded, keep), c_values, c_sessions, c_blocks,
                options), keep
