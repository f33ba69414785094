"""``mooncake.store`` on kvagent: MooncakeDistributedStore and the names callers import with it.

Drop-in for the Python API of Mooncake's binding (store_py.cpp), implemented on kvagent's own
Python SDK: every call goes to the node's kvagent, which owns the memory pool and the master
link. Conventions kept from Mooncake: methods return ints (0 or a size on success, a negative
Mooncake error code on failure) and never raise for a runtime failure; batch calls return one
int per key (all -600 when the argument lists differ in length); a put of a stored key returns
0 and keeps the stored value. Arguments of the wrong type raise TypeError, as the binding does.
The GIL is released while kvagent works (ctypes releases it around every C call).

What differs, and why, is listed in docs/sdk.md ("Mooncake compatibility").
"""
import ctypes
import logging
import os
import re
import threading
import time

import kvagent

from . import _codes, _direct, _replicate, _setup, _staging
from ._buffers import (BufferHandle, HostPools, MooncakeHostMemAllocator, RegisteredBuffers,
                       handle_over)
from ._replicate import ObjectDataType, ReplicaStatus, ReplicateConfig, SoftPinAction

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ObjectDataType",
           "ReplicaStatus", "BufferHandle", "MooncakeHostMemAllocator"]

log = logging.getLogger("mooncake.store")

HC_HEALTHY, HC_NOT_INITIALIZED, HC_MASTER_UNREACHABLE = 0, 1, 2
# "0" turns process memory off: every value then goes through the client's arena.
PROCESS_MEMORY_ENV = "KVAGENT_MOONCAKE_PROCESS_MEMORY"
_RECONNECT_INTERVAL_S = 1.0
_HEALTH_KEY = "__kvagent_mooncake_health__"
_NOT_SET_UP = _codes.INVALID_PARAMS


def _is_int(x):
    return isinstance(x, int) and type(x) is not bool


def _int_list(values, what):
    try:
        items = list(values)
    except TypeError:
        raise TypeError("%s must be a list of ints" % what) from None
    if all(type(v) is int for v in items) and (not items or min(items) >= 0):
        return items  # the common case, checked in bulk
    for v in items:
        if not _is_int(v) or v < 0:
            raise TypeError("%s must hold ints >= 0, got %r" % (what, v))
    return items


def _str_list(values, what):
    if isinstance(values, (str, bytes)):
        raise TypeError("%s must be a list of str, got %s" % (what, type(values).__name__))
    try:
        items = list(values)
    except TypeError:
        raise TypeError("%s must be a list of str" % what) from None
    for v in items:
        if not isinstance(v, (str, bytes)):
            raise TypeError("%s must hold str, got %s" % (what, type(v).__name__))
    return items


def _check_key(key):
    if not isinstance(key, (str, bytes)):
        raise TypeError("key must be a str, got %s" % type(key).__name__)


class _Connection:
    """One kvagent.Client and the ways values move through it: straight from/to this process's
    memory (``direct``, when the agent was granted it) or through the arena (``staging``)."""

    __slots__ = ("client", "staging", "direct")

    def __init__(self, client):
        self.client = client
        self.staging = _staging.Staging(client)
        self.direct = _direct.DirectPath(client) if client.process_memory else None

    @property
    def values(self):
        """The path for values in the caller's memory."""
        return self.direct or self.staging


class MooncakeDistributedStore:
    """A client of the node's kvagent with Mooncake's Python API. Create it, call setup() (or
    setup_dummy()), use it from any number of threads, close() it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._settings = None
        self._connection = None
        self._last_connect = 0.0
        self._registered = RegisteredBuffers()
        self._pool_memory = MooncakeHostMemAllocator()

    # ---- lifetime -------------------------------------------------------------------------

    def setup(self, *args, **kwargs):
        """setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
        protocol, rdma_devices, master_server_addr, engine=None, ...) or setup(config: dict),
        or setup() to read MOONCAKE_CONFIG_PATH / MOONCAKE_*. Connects to the node's kvagent
        (KVAGENT_RUN_DIR, default /run/kvagent). Returns 0, or -600 for a setting kvagent
        cannot honour, -900 when no agent answers (the log says why)."""
        try:
            if len(args) == 1 and not kwargs and isinstance(args[0], dict):
                settings = _setup.from_dict(args[0])
            elif not args and not kwargs:
                settings = _setup.from_environment()
            else:
                settings = _setup.from_arguments(args, kwargs)
        except _setup.Refused as e:
            log.error("%s", e)
            return e.code
        log.info("mooncake compat: connecting to kvagent at %s (ignored Mooncake settings: %s)",
                 settings.run_dir, settings.hints)
        with self._lock:
            self._close_locked()
            self._settings = settings
            self._pool_memory = MooncakeHostMemAllocator(settings.run_dir)
            return self._connect_locked()

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """Mooncake's standalone (dummy-client) mode: on kvagent the node agent already is the
        standalone process, so this connects to it like setup(). Returns 0 or a code."""
        for name, v in (("mem_pool_size", mem_pool_size),
                        ("local_buffer_size", local_buffer_size)):
            if not _is_int(v) or v < 0:
                raise TypeError("setup_dummy(): %s must be an int >= 0" % name)
        if not isinstance(server_address, str):
            raise TypeError("setup_dummy(): server_address must be a str")
        return self.setup({"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
                           "global_segment_size": mem_pool_size,
                           "local_buffer_size": local_buffer_size})

    def init_all(self, protocol, device_name, mount_segment_size=16 << 20):
        """Accepted for old callers; the agent's transport needs no initialization. Returns 0
        once set up, else -600."""
        del protocol, device_name, mount_segment_size
        return 0 if self._settings is not None else _NOT_SET_UP

    def close(self):
        """Disconnects from the agent and forgets the registered buffers. Returns 0. The store
        may be set up again."""
        with self._lock:
            self._close_locked()
            self._settings = None
        return 0

    def health_check(self):
        """0 when the agent and its master answer, 1 when not set up (or closed), 2 when the
        agent or its master cannot be reached."""
        if self._settings is None:
            return HC_NOT_INITIALIZED
        client = self._live()
        if client is None:
            return HC_MASTER_UNREACHABLE
        try:
            client.exist([_HEALTH_KEY])
        except kvagent.KvError as e:
            log.warning("health check: %s", e)
            return HC_MASTER_UNREACHABLE
        return HC_HEALTHY

    def get_hostname(self):
        """The local_hostname given to setup ("" before setup)."""
        s = self._settings
        return s.local_hostname if s is not None else ""

    # ---- buffers --------------------------------------------------------------------------

    def register_buffer(self, buffer_ptr, size):
        """Records a buffer of the caller's memory (a host KV pool). kvagent reads and writes
        any memory of the caller, registered or not; the record keeps Mooncake's contract.
        Returns 0, or -600 for a null pointer, a zero size, or before setup."""
        if not _is_int(buffer_ptr) or not _is_int(size) or buffer_ptr < 0 or size < 0:
            raise TypeError("register_buffer(buffer_ptr: int, size: int)")
        if self._settings is None:
            return _NOT_SET_UP
        if buffer_ptr == 0 or size == 0:
            log.error("register_buffer: null pointer or zero size")
            return _codes.INVALID_PARAMS
        self._registered.add(buffer_ptr, size)
        return 0

    def alloc_from_mem_pool(self, size):
        """``size`` bytes of host memory for buffers the caller will register (Mooncake's
        standalone mode hands out shared memory here): the address, or 0 when there is none or
        before setup. Freed by close()."""
        if not _is_int(size) or size < 0:
            raise TypeError("alloc_from_mem_pool(size: int)")
        if self._settings is None or size == 0:
            return 0
        return self._pool_memory.alloc(size)

    def unregister_buffer(self, buffer_ptr):
        """Forgets a registered buffer: 0, or -600 when it was not registered."""
        if not _is_int(buffer_ptr):
            raise TypeError("unregister_buffer(buffer_ptr: int)")
        if self._settings is None:
            return _NOT_SET_UP
        return 0 if self._registered.remove(buffer_ptr) else _codes.INVALID_PARAMS

    # ---- writes ---------------------------------------------------------------------------

    def put(self, key, value, config=None):
        """Stores bytes-like ``value`` under ``key`` (put-if-absent). Returns 0 or a code."""
        _check_key(key)
        return self._write([key], [self._bytes_source(value)], config, False)[0]

    def upsert(self, key, value, config=None):
        """Stores or replaces ``key``'s value. Returns 0 or a code."""
        _check_key(key)
        return self._write([key], [self._bytes_source(value)], config, True)[0]

    def put_batch(self, keys, values, config=None):
        """Stores several bytes-like values. Returns 0, or the first failing key's code."""
        return self._first_failure(self._write_values(keys, values, config, False))

    def upsert_batch(self, keys, values, config=None):
        """Stores or replaces several values. Returns 0, or the first failing key's code."""
        return self._first_failure(self._write_values(keys, values, config, True))

    def put_parts(self, key, *parts, config=None):
        """Stores the concatenation of the bytes-like ``parts`` as one value. Returns 0 (also
        for no bytes at all, which stores nothing) or a code."""
        return self._write_parts(key, parts, config, False)

    def upsert_parts(self, key, *parts, config=None):
        """Stores or replaces the concatenation of ``parts``. Returns 0 or a code."""
        return self._write_parts(key, parts, config, True)

    def put_from(self, key, buffer_ptr, size, config=None):
        """Stores ``size`` bytes at address ``buffer_ptr`` of this process. Returns 0 (also for
        size 0, which stores nothing) or a code."""
        return self._write_from_one(key, buffer_ptr, size, config, False)

    def upsert_from(self, key, buffer_ptr, size, config=None):
        """Stores or replaces ``key`` from ``size`` bytes at ``buffer_ptr``."""
        return self._write_from_one(key, buffer_ptr, size, config, True)

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        """Stores keys[i] from sizes[i] bytes at buffer_ptrs[i]. Returns one code per key."""
        return self._write_from(keys, buffer_ptrs, sizes, config, False, multi=False)

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        """batch_put_from, replacing stored values."""
        return self._write_from(keys, buffer_ptrs, sizes, config, True, multi=False)

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """Stores keys[i] gathered from the buffers all_buffer_ptrs[i] (sizes all_sizes[i]),
        in order, as one value. Returns one code per key."""
        return self._write_from(keys, all_buffer_ptrs, all_sizes, config, False, multi=True)

    def batch_upsert_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """batch_put_from_multi_buffers, replacing stored values."""
        return self._write_from(keys, all_buffer_ptrs, all_sizes, config, True, multi=True)

    # ---- reads ----------------------------------------------------------------------------

    def get(self, key):
        """The value as bytes; b"" when the key is missing or cannot be read."""
        _check_key(key)
        found = self._read_buffers([key])
        return b"" if found[0] is None else found[0][0].tobytes(found[0][1])

    def get_batch(self, keys):
        """One bytes per key; b"" for each key that is missing or cannot be read."""
        keys = _str_list(keys, "keys")
        return [b"" if f is None else f[0].tobytes(f[1]) for f in self._read_buffers(keys)]

    def get_buffer(self, key):
        """The value as a BufferHandle (no copy after the read), or None when missing."""
        _check_key(key)
        found = self._read_buffers([key])[0]
        return None if found is None else handle_over(*found)

    def batch_get_buffer(self, keys):
        """One BufferHandle per key, None for each key that is missing or cannot be read."""
        keys = _str_list(keys, "keys")
        return [None if f is None else handle_over(*f) for f in self._read_buffers(keys)]

    def get_into(self, key, buffer_ptr, size):
        """Reads the value into ``size`` bytes at ``buffer_ptr``. Returns the value's size, or
        a code (-600 when the buffer is too small, -704 when the key is missing)."""
        _check_key(key)
        if not _is_int(buffer_ptr) or not _is_int(size) or buffer_ptr < 0 or size < 0:
            raise TypeError("get_into(key, buffer_ptr: int, size: int)")
        return self._read_into([key], [[(buffer_ptr, size)]])[0]

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        """Reads keys[i] into sizes[i] bytes at buffer_ptrs[i] (sizes[i] is the capacity).
        Returns one size or code per key."""
        keys = _str_list(keys, "keys")
        ptrs = _int_list(buffer_ptrs, "buffer_ptrs")
        sizes = _int_list(sizes, "sizes")
        if not len(keys) == len(ptrs) == len(sizes):
            log.error("batch_get_into: %d keys, %d buffer_ptrs, %d sizes", len(keys), len(ptrs),
                      len(sizes))
            return [_codes.INVALID_PARAMS] * len(keys)
        return self._read_into(keys, [[(p, s)] for p, s in zip(ptrs, sizes)])

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node=False):
        """Reads keys[i] scattered over the buffers all_buffer_ptrs[i] (capacities
        all_sizes[i]) in order. Returns one size (the value's total bytes) or code per key."""
        del prefer_alloc_in_same_node  # a placement hint; the value is read wherever it is
        keys = _str_list(keys, "keys")
        regions = self._nested_regions(keys, all_buffer_ptrs, all_sizes)
        if regions is None:
            return [_codes.INVALID_PARAMS] * len(keys)
        return self._read_into(keys, regions)

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                        all_sizes):
        """Ranged reads into registered buffers: for buffer i, key j and range k, copies
        all_sizes[i][j][k] bytes from offset all_src_offsets[i][j][k] of the value of
        all_keys[i][j] to all_dst_offsets[i][j][k] bytes into buffer_ptrs[i]. Returns the same
        nesting (one entry per destination offset) of bytes copied or codes: -600 for lists
        that do not line up, a range outside the value or outside the registered buffer, and
        the key's code when it cannot be read."""
        ptrs = _int_list(buffer_ptrs, "buffer_ptrs")
        keys, dsts = list(all_keys), list(all_dst_offsets)
        srcs, sizes = list(all_src_offsets), list(all_sizes)
        results = [[[_codes.INVALID_PARAMS] * len(dsts[i][j]) if i < len(dsts) and
                     j < len(dsts[i]) else [_codes.INVALID_PARAMS]
                     for j in range(len(keys[i]) if i < len(keys) else 1)]
                   for i in range(len(ptrs))]
        if not len(ptrs) == len(keys) == len(dsts) == len(srcs) == len(sizes):
            log.error("get_into_ranges: the outer lists differ in length")
            return results
        wanted = []  # (i, j) whose lists line up in a registered buffer
        for i, ptr in enumerate(ptrs):
            if not self._registered.capacity_at(ptr) or not (
                    len(keys[i]) == len(dsts[i]) == len(srcs[i]) == len(sizes[i])):
                continue
            dsts[i], srcs[i], sizes[i] = list(dsts[i]), list(srcs[i]), list(sizes[i])
            for j in range(len(keys[i])):
                # Unsigned, as Mooncake's binding takes them: a negative offset or size would
                # copy outside the value or the buffer (memmove trusts them).
                dsts[i][j] = _int_list(dsts[i][j], "all_dst_offsets[%d][%d]" % (i, j))
                srcs[i][j] = _int_list(srcs[i][j], "all_src_offsets[%d][%d]" % (i, j))
                sizes[i][j] = _int_list(sizes[i][j], "all_sizes[%d][%d]" % (i, j))
            wanted += [(i, j) for j in range(len(keys[i]))
                       if len(dsts[i][j]) == len(srcs[i][j]) == len(sizes[i][j])]
        names = sorted({keys[i][j] for i, j in wanted})
        for name in names:
            _check_key(name)
        connection = self._connected()
        codes = [0] * len(names)
        found = [None] * len(names)
        if connection is None:
            codes = [self._unavailable_code()] * len(names)
        elif names:
            found = connection.staging.read_buffers(names, codes)
        values = dict(zip(names, zip(found, codes)))
        for i, j in wanted:
            value, code = values[keys[i][j]]
            if value is None:
                results[i][j] = [code if code < 0 else _codes.INVALID_PARAMS] * len(dsts[i][j])
                continue
            buf, length = value
            capacity = self._registered.capacity_at(ptrs[i])
            for k, (dst, src, n) in enumerate(zip(dsts[i][j], srcs[i][j], sizes[i][j])):
                if dst + n <= capacity and src + n <= length:
                    ctypes.memmove(ptrs[i] + dst, buf.address + src, n)
                    results[i][j][k] = n
        return results

    def get_size(self, key):
        """The value's size in bytes, or a code (-704 when missing). Like Mooncake's query,
        it grants the key a read lease."""
        _check_key(key)
        connection = self._connected()
        if connection is None:
            return self._unavailable_code()
        try:
            with connection.client.allocate(1) as probe:
                row = connection.client.get([key], [probe]).keys[0]
        except kvagent.KvError as e:
            return _codes.from_kvagent(e.code)
        if row.code in (kvagent.ErrorCode.OK, kvagent.ErrorCode.BUFFER_OUT_OF_RANGE):
            return row.length
        return _codes.from_kvagent(row.code)

    # ---- existence and removal -------------------------------------------------------------

    def is_exist(self, key):
        """1 when the key is readable, 0 when not, a negative code when unknown."""
        _check_key(key)
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys):
        """One 1/0/negative per key."""
        keys = _str_list(keys, "keys")

        def call(client, part):
            r = client.exist(part)
            return [1 if k.exists else (0 if k.code in (kvagent.ErrorCode.OK,
                                                        kvagent.ErrorCode.OBJECT_NOT_FOUND)
                                        else _codes.from_kvagent(k.code)) for k in r.keys]
        return self._keyed(keys, call)

    def remove(self, key, force=False):
        """Removes one object: 0, -704 when missing, -706 while a read lease holds it (unless
        ``force``)."""
        _check_key(key)
        return self.batch_remove([key], force)[0]

    def batch_remove(self, keys, force=False):
        """Removes objects; one code per key."""
        keys = _str_list(keys, "keys")
        return self._keyed(keys, lambda c, part: _codes.codes_of(c.remove(part, force=force)))

    def remove_by_regex(self, regex_pattern, force=False):
        """Removes every object whose key matches ``regex_pattern`` (searched anywhere in the
        key, Python ``re`` syntax); leased objects are skipped unless ``force``. Returns how
        many were removed, or a code (-600 for a bad pattern)."""
        if not isinstance(regex_pattern, str):
            raise TypeError("remove_by_regex(regex_pattern: str, force: bool = False)")
        try:
            pattern = re.compile(regex_pattern)
        except re.error as e:
            log.error("remove_by_regex: bad pattern %r: %s", regex_pattern, e)
            return _codes.INVALID_PARAMS
        connection = self._connected()
        if connection is None:
            return self._unavailable_code()
        try:
            matched = [k.key for k in connection.client.iter_keys() if pattern.search(k.key)]
        except kvagent.KvError as e:
            return _codes.from_kvagent(e.code)
        codes = self.batch_remove(matched, force)
        failures = [c for c in codes if c not in (0, _codes.OBJECT_NOT_FOUND,
                                                  _codes.OBJECT_HAS_LEASE,
                                                  _codes.REPLICA_IS_NOT_READY)]
        if failures and len(failures) == len(codes):
            return failures[0]
        return sum(1 for c in codes if c == 0)

    def remove_all(self, force=False):
        """Removes every object (leased ones only with ``force``). Returns how many, or a
        code."""
        connection = self._connected()
        if connection is None:
            return self._unavailable_code()
        try:
            return connection.client.remove_all(force=bool(force)).removed_count
        except kvagent.KvError as e:
            return _codes.from_kvagent(e.code)

    # ---- plumbing --------------------------------------------------------------------------

    def _close_locked(self):
        if self._connection is not None:
            self._connection.client.close()
        self._connection = None
        self._registered.clear()
        self._pool_memory.free_all()

    def _connect_locked(self):
        s = self._settings
        self._last_connect = time.monotonic()
        want_memory = os.environ.get(PROCESS_MEMORY_ENV, "1") != "0"
        try:
            client = kvagent.Client(run_dir=s.run_dir, name="mooncake-compat",
                                    arena_bytes=s.arena_bytes, process_memory=want_memory)
        except kvagent.KvError as e:
            log.error("cannot reach kvagent at %s: %s", s.run_dir, e)
            return _codes.from_kvagent(e.code)
        if want_memory and not client.process_memory:
            log.warning("kvagent did not grant process memory (its log says why): values go "
                        "through the shared-memory arena, one more copy each")
        self._connection = _Connection(client)
        return 0

    def _connected(self):
        """The live _Connection; reconnects (at most once a second) after the agent went away.
        None when not set up or no agent answers."""
        connection = self._connection
        if connection is not None and connection.client.connected:
            return connection
        with self._lock:
            if self._settings is None:
                return None
            connection = self._connection
            if connection is not None and connection.client.connected:
                return connection
            if time.monotonic() - self._last_connect < _RECONNECT_INTERVAL_S:
                return None
            if connection is not None:
                # Not closed here: another thread may be inside a call on it (closing frees the
                # C client under it). It is freed when the last reference to it goes, and its
                # calls fail with AGENT_UNAVAILABLE meanwhile.
                self._connection = None
            self._connect_locked()
            return self._connection

    def _live(self):
        connection = self._connected()
        return None if connection is None else connection.client

    def _unavailable_code(self):
        return _NOT_SET_UP if self._settings is None else _codes.RPC_FAIL

    def _keyed(self, keys, call):
        """Runs call(client, keys_part) -> codes over parts of at most MAX_KEYS_PER_CALL valid
        keys; invalid keys get -600, a failed call its code for each of its keys."""
        out = [0] * len(keys)
        connection = self._connected()
        if connection is None:
            return [self._unavailable_code()] * len(keys)
        valid = []
        for i, k in enumerate(keys):
            if _staging.key_error(k) is None:
                valid.append(i)
            else:
                out[i] = _codes.INVALID_PARAMS
        for start in range(0, len(valid), _staging.MAX_KEYS_PER_CALL):
            part = valid[start:start + _staging.MAX_KEYS_PER_CALL]
            try:
                codes = call(connection.client, [keys[i] for i in part])
            except kvagent.KvError as e:
                codes = [_codes.from_kvagent(e.code)] * len(part)
            for i, c in zip(part, codes):
                out[i] = c
        return out

    @staticmethod
    def _first_failure(codes):
        return next((c for c in codes if c != 0), 0)

    @staticmethod
    def _bytes_source(value):
        try:
            view = memoryview(value)
        except TypeError:
            raise TypeError("value must support the buffer protocol (bytes, bytearray, "
                            "memoryview, ...), got %s" % type(value).__name__) from None
        return value if type(value) is bytes else view

    def _write_values(self, keys, values, config, upsert):
        keys = _str_list(keys, "keys")
        try:
            values = list(values)
        except TypeError:
            raise TypeError("values must be a list of bytes-like objects") from None
        sources = [self._bytes_source(v) for v in values]
        if len(keys) != len(sources):
            log.error("%d keys and %d values", len(keys), len(sources))
            return [_codes.INVALID_PARAMS] * len(keys)
        return self._write(keys, sources, config, upsert)

    def _write_parts(self, key, parts, config, upsert):
        _check_key(key)
        views = []
        for p in parts:
            view = memoryview(p)
            if view.ndim > 1 or view.itemsize != 1:
                raise RuntimeError("parts must be 1-D bytes-like")
            views.append(view)
        total = sum(v.nbytes for v in views)
        if total == 0:
            log.warning("put_parts of %.80r with no bytes: nothing stored", key)
            return 0
        return self._write([key], [b"".join(views)], config, upsert)[0]

    def _write_from_one(self, key, buffer_ptr, size, config, upsert):
        _check_key(key)
        if not _is_int(buffer_ptr) or not _is_int(size) or buffer_ptr < 0 or size < 0:
            raise TypeError("put_from(key, buffer_ptr: int, size: int, config=None)")
        if size == 0:
            log.warning("put_from of %.80r with size 0: nothing stored", key)
            return 0
        return self._write([key], [[(buffer_ptr, size)]], config, upsert)[0]

    def _write_from(self, keys, ptrs, sizes, config, upsert, multi):
        keys = _str_list(keys, "keys")
        if multi:
            regions = self._nested_regions(keys, ptrs, sizes)
            if regions is None:
                return [_codes.INVALID_PARAMS] * len(keys)
        else:
            ptrs = _int_list(ptrs, "buffer_ptrs")
            sizes = _int_list(sizes, "sizes")
            if not len(keys) == len(ptrs) == len(sizes):
                log.error("%d keys, %d buffer_ptrs, %d sizes", len(keys), len(ptrs), len(sizes))
                return [_codes.INVALID_PARAMS] * len(keys)
            regions = [[(p, s)] for p, s in zip(ptrs, sizes)]
        return self._write(keys, regions, config, upsert)

    @staticmethod
    def _nested_regions(keys, all_ptrs, all_sizes):
        """[[(address, size), ...] per key], or None when the lists do not line up."""
        try:
            all_ptrs, all_sizes = list(all_ptrs), list(all_sizes)
        except TypeError:
            raise TypeError("all_buffer_ptrs and all_sizes must be lists of lists") from None
        if not len(keys) == len(all_ptrs) == len(all_sizes):
            log.error("%d keys, %d buffer lists, %d size lists", len(keys), len(all_ptrs),
                      len(all_sizes))
            return None
        regions = []
        for i, (ptrs, sizes) in enumerate(zip(all_ptrs, all_sizes)):
            ptrs = _int_list(ptrs, "all_buffer_ptrs[%d]" % i)
            sizes = _int_list(sizes, "all_sizes[%d]" % i)
            if len(ptrs) != len(sizes):
                log.error("key %d: %d buffers and %d sizes", i, len(ptrs), len(sizes))
                return None
            regions.append(list(zip(ptrs, sizes)))
        return regions

    def _write(self, keys, sources, config, upsert):
        """Stores keys[i] from sources[i] (a bytes-like object, or a list of (address, size)
        regions); one Mooncake code per key. Nothing is stored when the config is refused."""
        n = len(keys)
        try:
            plan = _replicate.plan_write(config, n, upsert)
        except _replicate.ConfigRefused as e:
            log.error("write refused: %s", e)
            return [_codes.INVALID_PARAMS] * n
        connection = self._connected()
        if connection is None:
            return [self._unavailable_code()] * n
        out = [0] * n
        for i, (k, src) in enumerate(zip(keys, sources)):
            why = _staging.key_error(k)
            if why is not None:
                log.error("key %.80r %s", k, why)
                out[i] = _codes.INVALID_PARAMS
            elif type(src) is list:
                if len(src) == 1 and src[0][0] and src[0][1]:
                    continue  # one range with an address and a size: the common case
                if any(a == 0 for a, s in src if s) or not sum(s for _, s in src):
                    log.error("value of %.80r: a null buffer, or no bytes at all", k)
                    out[i] = _codes.INVALID_PARAMS
            elif memoryview(src).nbytes == 0:
                log.error("value of %.80r is empty; kvagent stores 1 byte or more", k)
                out[i] = _codes.INVALID_PARAMS
        for path, todo in self._routes(connection, sources, out):
            path.write(keys, sources, plan, upsert, out, todo)
        return out

    def _read_into(self, keys, regions):
        connection = self._connected()
        if connection is None:
            return [self._unavailable_code()] * len(keys)
        out = [0] * len(keys)
        for i, k in enumerate(keys):
            r = regions[i]
            if len(r) == 1 and r[0][0] and r[0][1]:
                bad = False  # one range with an address and a size: the common case
            else:
                bad = any(a == 0 for a, s in r if s) or not sum(s for _, s in r)
            if bad or _staging.key_error(k) is not None:
                out[i] = _codes.INVALID_PARAMS
        for path, todo in self._routes(connection, regions, out):
            path.read_into(keys, regions, out, todo)
        return out

    @staticmethod
    def _routes(connection, sources, out):
        """(path, key indices) for every key still to do (out[i] == 0): keys whose bytes are
        one range of a host pool in kvagent shared memory go through that pool's client (no
        copy on this side), the others through this store's connection. A pool whose client
        lost its agent (the agent restarted) is memory like any other: its keys go through
        this store's connection, which reconnects."""
        pooled, rest = HostPools.owners(sources, [i for i, code in enumerate(out) if not code])
        routes = []
        for client, todo in pooled.items():
            if client.connected:
                routes.append((_direct.DirectPath(client), todo))
            else:
                rest = sorted(rest + todo)
        if rest:
            routes.append((connection.values, rest))
        return routes

    def _read_buffers(self, keys):
        connection = self._connected()
        if connection is None:
            return [None] * len(keys)
        out = [0] * len(keys)
        for i, k in enumerate(keys):
            if _staging.key_error(k) is not None:
                out[i] = _codes.INVALID_PARAMS
        return connection.staging.read_buffers(keys, out)
