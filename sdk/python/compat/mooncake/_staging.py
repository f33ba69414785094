"""Moving values between a caller's memory and kvagent through the client's arena.

The kvagent SDK reads values from, and writes them into, its shared-memory arena; the agent
copies between the arena and the node pool. A caller's own memory (a registered host KV pool, a
bytes object) is copied into the arena for a put and out of it after a get: two copies of each
byte. Batches are cut into sends that fit a share of the arena (``ArenaGate``), so a batch of
any size works and concurrent callers do not starve each other.

Every function returns Mooncake codes and never raises for a runtime failure.
"""
import ctypes
import logging
import threading

import kvagent

from . import _codes

log = logging.getLogger("mooncake.store")

MAX_KEYS_PER_CALL = 4096  # well inside one request frame of the default 1 MiB ring
MAX_KEY_BYTES = 4096


class ArenaGate:
    """Bounds the arena bytes the compat's calls hold at once, so that allocations do not fail
    because of each other: reserve() waits until the bytes fit (or nothing else is held)."""

    def __init__(self, budget):
        self.budget = budget
        self._held = 0
        self._cond = threading.Condition()

    def reserve(self, size):
        with self._cond:
            while self._held and self._held + size > self.budget:
                self._cond.wait()
            self._held += size

    def release(self, size):
        with self._cond:
            self._held -= size
            self._cond.notify_all()


def key_error(key):
    """Why ``key`` cannot be a kvagent key (None when it can): non-empty UTF-8, <= 4096 bytes."""
    if type(key) is str and 0 < len(key) <= MAX_KEY_BYTES // 4 and key.isascii():
        return None  # the common case, without encoding
    if isinstance(key, str):
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError:
            return "is not valid UTF-8"
    elif isinstance(key, bytes):
        try:
            key.decode("utf-8")
        except UnicodeDecodeError:
            return "is not valid UTF-8"
        size = len(key)
    else:
        return "is a %s, not a str" % type(key).__name__
    if size == 0:
        return "is empty"
    if size > MAX_KEY_BYTES:
        return "is %d bytes; the limit is %d" % (size, MAX_KEY_BYTES)
    return None


def _chunks(indices, sizes, budget):
    """Consecutive groups of ``indices`` whose sizes add up to at most ``budget`` (a larger
    single value gets a group of its own) and at most MAX_KEYS_PER_CALL keys."""
    group, total = [], 0
    for i in indices:
        if group and (total + sizes[i] > budget or len(group) >= MAX_KEYS_PER_CALL):
            yield group, total
            group, total = [], 0
        group.append(i)
        total += sizes[i]
    if group:
        yield group, total


def _raw(address, size):
    """A writable ctypes view of ``size`` bytes at ``address`` (what the SDK copies from)."""
    return (ctypes.c_char * size).from_address(address)


class Staging:
    """The arena path for one connected kvagent.Client."""

    def __init__(self, client):
        self.client = client
        self.arena_bytes = client.arena_bytes
        self.gate = ArenaGate(max(1, self.arena_bytes * 3 // 4))

    # ---- writes ---------------------------------------------------------------------------

    def write(self, keys, sources, plan, upsert, out, todo):
        """Stores keys[i] from sources[i] for every i in ``todo``; a source is a list of
        (address, size) regions gathered in order, or a bytes-like object. Sets out[i] to the
        Mooncake code of each of those keys. Session IDs are taken by the key's position."""
        sizes = [0] * len(keys)
        for i in todo:
            src = sources[i]
            sizes[i] = sum(s for _, s in src) if isinstance(src, list) else memoryview(src).nbytes
        fits = []
        for i in todo:
            size = sizes[i]
            if size > self.arena_bytes:
                log.error("value of %.80r is %d bytes, larger than the %d-byte arena; raise "
                          "local_buffer_size (and the agent's --max-arena-bytes)", keys[i], size,
                          self.arena_bytes)
                out[i] = _codes.INVALID_PARAMS
            else:
                fits.append(i)
        stop = 0
        for group, _ in _chunks(fits, sizes, self.gate.budget):
            if stop:
                for i in group:
                    out[i] = stop
                continue
            stop = self._send(group, sizes, out, lambda part: self._write_group(
                keys, sources, sizes, plan, upsert, part, out))

    def _send(self, group, sizes, out, attempt):
        """Runs attempt(group) with the group's bytes reserved in the gate. When the arena has
        no room (NoSpace: fragmented, or shared with other threads' calls) each half is tried
        again; a single key that still finds none gets -200. Returns a code that ends the whole
        call (the agent is gone) or 0."""
        total = sum(sizes[i] for i in group)
        self.gate.reserve(total)
        try:
            return attempt(group)
        except kvagent.NoSpace:
            pass
        finally:
            self.gate.release(total)
        if len(group) == 1:
            out[group[0]] = _codes.NO_AVAILABLE_HANDLE
            return 0
        half = len(group) // 2
        stop = self._send(group[:half], sizes, out, attempt)
        if stop:
            for i in group[half:]:
                out[i] = stop
            return stop
        return self._send(group[half:], sizes, out, attempt)

    def _write_group(self, keys, sources, sizes, plan, upsert, group, out):
        """One put/upsert of ``group``; raises NoSpace when the arena has no room for it."""
        held = []  # arena copies of gathered values, freed once the call returns
        try:
            values = []
            for i in group:
                src = sources[i]
                if not isinstance(src, list):
                    values.append(src)
                elif len(src) == 1:
                    values.append(_raw(*src[0]))
                else:
                    buf = self.client.allocate(sizes[i])
                    held.append(buf)
                    offset, base = 0, buf.address
                    for address, size in src:
                        ctypes.memmove(base + offset, address, size)
                        offset += size
                    values.append(buf)
            sessions = None
            if plan.session_ids is not None:
                sessions = [plan.session_ids[i] for i in group]
            call = self.client.upsert if upsert else self.client.put
            result = call([keys[i] for i in group], values, session_ids=sessions, **plan.options)
        except kvagent.NoSpace:
            raise
        except kvagent.KvError as e:
            return self._fail(group, e, out)
        finally:
            for buf in held:
                buf.close()
        for i, code in zip(group, _codes.codes_of(result)):
            out[i] = code
        return 0

    @staticmethod
    def _fail(group, error, out):
        code = _codes.from_kvagent(error.code)
        if error.code != kvagent.ErrorCode.INVALID_PARAMS:
            log.warning("kvagent call failed: %s", error)
        else:
            log.error("kvagent refused the call: %s", error)
        for i in group:
            out[i] = code
        return code if error.code == kvagent.ErrorCode.AGENT_UNAVAILABLE else 0

    # ---- reads ----------------------------------------------------------------------------

    def read_into(self, keys, targets, out, todo):
        """Reads keys[i] into targets[i] (a list of (address, size) regions filled in order)
        for every i in ``todo``; sets out[i] to the value's size or a Mooncake code (-600 when
        the value is larger than the regions)."""
        capacity = [sum(s for _, s in t) for t in targets]

        def deliver(i, buf, length):
            if length > capacity[i]:
                return _codes.INVALID_PARAMS
            offset, base = 0, buf.address
            for address, size in targets[i]:
                n = min(size, length - offset)
                if n <= 0:
                    break
                ctypes.memmove(address, base + offset, n)
                offset += n
            return length

        self._read(keys, capacity, capacity, deliver, out, todo)

    def read_buffers(self, keys, out, first_guess=256 << 10):
        """Reads whole values into arena buffers: returns one (ArenaBuffer, length) or None per
        key and sets out[i] to the size or a Mooncake code."""
        found = [None] * len(keys)

        def keep(i, buf, length):
            found[i] = (buf, length)
            return length

        n = len(keys)
        todo = [i for i in range(n) if not out[i]]
        self._read(keys, [first_guess] * n, [self.arena_bytes] * n, keep, out, todo,
                   keep_buffers=True)
        return found

    def _read(self, keys, first, capacity, deliver, out, todo, keep_buffers=False):
        """Gets every key of ``todo`` into arena buffers of min(first[i], budget) bytes, calls
        deliver(i, buffer, length) -> code for each value read, and fetches again, at its exact
        size, each value that was larger than its first buffer but fits capacity[i]."""
        budget = self.gate.budget
        first = [min(f, budget) for f in first]
        again = []
        stop = 0
        for group, _ in _chunks(todo, first, budget):
            if stop:
                for i in group:
                    out[i] = stop
                continue
            stop = self._send(group, first, out, lambda part: self._read_group(
                keys, first, capacity, deliver, part, out, again, keep_buffers))
        for i, needed in again:  # values larger than their first buffer, at their exact size
            if stop:
                out[i] = stop
                continue
            exact = {i: needed}
            stop = self._send([i], exact, out, lambda part: self._read_group(
                keys, exact, capacity, deliver, part, out, None, keep_buffers))

    def _read_group(self, keys, sizes, capacity, deliver, group, out, again, keep_buffers):
        """One get of ``group`` into new arena buffers; raises NoSpace when they do not fit."""
        buffers = []
        try:
            for i in group:
                buffers.append(self.client.allocate(max(1, sizes[i])))
            rows = self.client.get([keys[i] for i in group], buffers).keys
            for i, buf, row in zip(group, buffers, rows):
                if row.code == kvagent.ErrorCode.OK:
                    out[i] = deliver(i, buf, row.length)
                elif (row.code == kvagent.ErrorCode.BUFFER_OUT_OF_RANGE and again is not None
                      and sizes[i] < row.length <= min(capacity[i], self.arena_bytes)):
                    again.append((i, row.length))
                else:
                    out[i] = _codes.from_kvagent(row.code)
            return 0
        except kvagent.NoSpace:
            raise
        except kvagent.KvError as e:
            return self._fail(group, e, out)
        finally:
            if not keep_buffers:
                for b in buffers:
                    b.close()
