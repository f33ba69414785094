"""Moving values straight between a caller's memory and the node pool (process memory).

When the agent was granted this process's memory (kvagent.Client(process_memory=True) and
Client.process_memory), put_from/get_into hand it the addresses: the agent copies each value
once, between the engine's buffers and the node pool, with no arena in between and no limit
from the arena's size. An address the agent cannot read or write fails only its key (-600),
never the agent or this process. Bytes objects are passed by address too.

Every function returns Mooncake codes and never raises for a runtime failure.
"""
import ctypes
import logging

import kvagent

from . import _codes
from ._staging import MAX_KEYS_PER_CALL

log = logging.getLogger("mooncake.store")

MAX_RANGES_PER_CALL = 16384  # 256 KiB of ranges: one request frame of the default 1 MiB ring


def _groups(indices, range_counts):
    """Consecutive groups of ``indices`` of at most MAX_KEYS_PER_CALL keys and
    MAX_RANGES_PER_CALL ranges (a key with more ranges gets a group of its own)."""
    group, ranges = [], 0
    for i in indices:
        if group and (len(group) >= MAX_KEYS_PER_CALL
                      or ranges + range_counts[i] > MAX_RANGES_PER_CALL):
            yield group
            group, ranges = [], 0
        group.append(i)
        ranges += range_counts[i]
    if group:
        yield group


def _pairs(source, keep):
    """A source as (address, size) pairs: regions pass as they are; a bytes-like object is
    passed by the address of its bytes (a read-only non-bytes buffer is copied first)."""
    if isinstance(source, list):
        return source
    if type(source) is bytes:
        keep.append(source)
        return [(ctypes.cast(ctypes.c_char_p(source), ctypes.c_void_p).value, len(source))]
    view = memoryview(source)
    if not (view.c_contiguous and not view.readonly):
        data = view.tobytes()
        keep.append(data)
        return [(ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value, len(data))]
    array = (ctypes.c_char * view.nbytes).from_buffer(view)
    keep.append(array)
    return [(ctypes.addressof(array), view.nbytes)]


def _send_all(groups, out, send):
    """Calls send(group) -> stop code for each group; once one returns a code (the agent is
    gone), the groups after it get that code without being sent."""
    stop = 0
    for group in groups:
        if stop:
            for i in group:
                out[i] = stop
        else:
            stop = send(group)


def _fail(group, error, out):
    """Every key of ``group`` gets the code of a call that failed as a whole; returns the code
    when the agent is gone (the rest of the call is not tried), else 0."""
    code = _codes.from_kvagent(error.code)
    log.warning("kvagent call failed: %s", error)
    for i in group:
        out[i] = code
    return code if error.code == kvagent.ErrorCode.AGENT_UNAVAILABLE else 0


class DirectPath:
    """put_from/get_into of one connected kvagent.Client that was granted process memory."""

    def __init__(self, client):
        self.client = client

    def write(self, keys, sources, plan, upsert, out, todo):
        """Stores keys[i] from sources[i] (a list of (address, size) regions gathered in order,
        or a bytes-like object) for every i in ``todo``; sets out[i] to each of those keys'
        Mooncake code. Session IDs are taken by the key's position."""
        keep = []
        pairs = [None] * len(keys)
        counts = [0] * len(keys)
        for i in todo:
            pairs[i] = _pairs(sources[i], keep)
            counts[i] = len(pairs[i])
        call = self.client.upsert_from if upsert else self.client.put_from

        def send(group):
            sessions = None
            if plan.session_ids is not None:
                sessions = [plan.session_ids[i] for i in group]
            regions = [pairs[i][0] if counts[i] == 1 else pairs[i] for i in group]
            try:
                result = call([keys[i] for i in group], regions, session_ids=sessions,
                              **plan.options)
            except kvagent.KvError as e:
                return _fail(group, e, out)
            for i, code in zip(group, _codes.codes_of(result)):
                out[i] = code
            return 0

        _send_all(_groups(todo, counts), out, send)
        del keep

    def read_into(self, keys, targets, out, todo):
        """Reads keys[i] into targets[i] (a list of (address, size) regions filled in order)
        for every i in ``todo``; sets out[i] to the value's size or a Mooncake code (-600 when
        the value is larger than the regions)."""
        counts = [len(t) for t in targets]
        ok = kvagent.ErrorCode.OK

        def send(group):
            regions = [targets[i][0] if counts[i] == 1 else targets[i] for i in group]
            try:
                result = self.client.get_into([keys[i] for i in group], regions)
            except kvagent.KvError as e:
                return _fail(group, e, out)
            for i, code, length in zip(group, result.codes, result.lengths):
                out[i] = length if code == ok else _codes.from_kvagent(code)
            return 0

        _send_all(_groups(todo, counts), out, send)
