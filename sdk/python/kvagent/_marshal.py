"""Python arguments to C arrays and kv_result_t back to Python, built in bulk.

Per-key work is the hot path of every call from an engine (batches of tens to hundreds of
keys), so the arrays are filled from a few list and array operations rather than field by
field: all keys of a call are joined into one bytes object and the kv_bytes_t array is laid over
an array("Q") of (address, length) pairs; per-key results are read with one struct.iter_unpack.
"""
import array
import ctypes
import itertools
import struct

from . import _native as native
from .errors import ErrorCode, InvalidParams, error_for

U64_MASK = (1 << 64) - 1
_CODES = tuple(ErrorCode)  # index = wire value
# kv_key_result_t: code, exists, length, message, size, replicas (+ padding)
_KEY_RESULT = struct.Struct("=iIQQQI4x")
assert _KEY_RESULT.size == ctypes.sizeof(native.KeyResult), "kv_key_result_t layout changed"
assert ctypes.sizeof(native.Bytes) == 16 and array.array("Q").itemsize == ctypes.sizeof(ctypes.c_void_p) == 8


def invalid(message):
    """An InvalidParams for an argument refused before the library sees it."""
    return InvalidParams(ErrorCode.INVALID_PARAMS, message)


def unsigned(value, bits, what, low=0):
    """`value` checked to be an integer in [low, 2**bits - 1] (ctypes would wrap it silently:
    replica_count=257 became 1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid("%s is a %s; give an integer" % (what, type(value).__name__))
    high = (1 << bits) - 1
    if not low <= value <= high:
        raise invalid("%s is %d; give %d..%d" % (what, value, low, high))
    return value


def encode(text, what):
    """A key or session ID as bytes: str is UTF-8 encoded, bytes-like passes unchanged (so
    invalid bytes reach the library's own validation); None is empty."""
    if text is None:
        return b""
    if isinstance(text, str):
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise invalid("%s is not encodable as UTF-8 (%s)" % (what, e.reason)) from None
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    raise invalid("%s is a %s; give str or bytes" % (what, type(text).__name__))


def encode_all(items, what):
    """Every item encoded (see encode); str items take the fast path."""
    try:
        return [s.encode() if type(s) is str else encode(s, what) for s in items]
    except UnicodeEncodeError:
        return [encode(s, "%s[%d]" % (what, i)) for i, s in enumerate(items)]  # names the index


def one_per_key(items, key_count, what, each):
    """``items`` as a list, checked to hold one entry per key."""
    items = list(items)
    if len(items) != key_count:
        raise invalid("%d %s for %d keys; give %s per key" % (len(items), what, key_count, each))
    return items


def bytes_array(encoded, keep):
    """A kv_bytes_t array over ``encoded`` (a list of bytes); what it points into is added to
    ``keep``, which the caller holds until the call is submitted."""
    n = len(encoded)
    if n == 0:
        return None
    blob = b"".join(encoded)
    base = ctypes.cast(ctypes.c_char_p(blob), ctypes.c_void_p).value
    lengths = list(map(len, encoded))
    pairs = [0] * (2 * n)
    pairs[0::2] = itertools.accumulate(lengths[:-1], initial=base)
    pairs[1::2] = lengths
    words = array.array("Q", pairs)
    keep.extend((blob, words))
    return (native.Bytes * n).from_buffer(words)


def pointer_array(addresses, keep):
    """A void* array of ``addresses`` (ints), laid over an array("Q") added to ``keep``
    (ctypes' own array constructor costs several times more per element)."""
    words = array.array("Q", addresses)
    keep.append(words)
    return (ctypes.c_void_p * len(words)).from_buffer(words)


def value_array(values, buffer_type, keep):
    """A kv_value_t array: an arena buffer (``buffer_type``), (buffer, length) or bytes-like
    each. Writable contiguous objects (bytearray, numpy arrays) are passed without a copy."""
    c = (native.Value * len(values))()
    for i, v in enumerate(values):
        if isinstance(v, buffer_type):
            c[i].buffer, c[i].size = v._c_handle(), v.size
        elif isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], buffer_type):
            c[i].buffer, c[i].size = v[0]._c_handle(), v[1]
        elif type(v) is bytes:
            keep.append(v)
            c[i].bytes = ctypes.cast(ctypes.c_char_p(v), ctypes.c_void_p)
            c[i].size = len(v)
        else:
            try:
                view = memoryview(v)
            except TypeError:
                raise invalid("values[%d] is a %s; give an ArenaBuffer, (ArenaBuffer, length) or "
                              "bytes" % (i, type(v).__name__)) from None
            if view.c_contiguous and not view.readonly:
                source = (ctypes.c_char * view.nbytes).from_buffer(view)
                c[i].bytes = ctypes.addressof(source)
            else:
                source = view.tobytes()
                c[i].bytes = ctypes.cast(ctypes.c_char_p(source), ctypes.c_void_p)
            keep.append(source)
            c[i].size = view.nbytes
    return c


def memory_arrays(entries, key_count, what, keep):
    """(kv_memory_range_t array, size_t counts array or None) for one entry per key, each an
    (address, size) pair or a list of such pairs (gathered or filled in order). Built over
    array("Q") words: kv_memory_range_t is (void*, size_t)."""
    entries = one_per_key(entries, key_count, what, "(address, size) or a list of them")
    if key_count == 0:
        return None, None
    try:
        if all(type(e) is tuple for e in entries):  # the common case: one range per key
            words = array.array("Q", [x for e in entries for x in e])
            counts = None
            if len(words) != 2 * key_count:
                raise ValueError
        else:
            flat, counts = [], []
            for e in entries:
                ranges = [e] if type(e) is tuple else list(e)
                counts.append(len(ranges))
                for r in ranges:
                    address, size = r
                    flat += (address, size)
            words = array.array("Q", flat)
    except (TypeError, ValueError, OverflowError):
        raise invalid("%s: give (address, size) pairs of ints >= 0, or a list of them per key"
                      % what) from None
    keep.append(words)
    c_ranges = (native.MemoryRange * (len(words) // 2)).from_buffer(words)
    c_counts = None
    if counts is not None:
        count_words = array.array("Q", counts)
        keep.append(count_words)
        c_counts = (ctypes.c_size_t * len(count_words)).from_buffer(count_words)
    return c_ranges, c_counts


def block_array(blocks, keep):
    """A kv_block_t array; None entries mean "no metadata for this key"."""
    c = (native.Block * len(blocks))()
    for i, b in enumerate(blocks):
        if b is None:
            continue
        hashes = (ctypes.c_uint64 * len(b.hashes))(*[h & U64_MASK for h in b.hashes])
        tokens = (ctypes.c_uint32 * len(b.token_ids))(
            *[unsigned(t, 32, "blocks[%d].token_ids" % i) for t in b.token_ids])
        lora = encode(b.lora_name, "blocks[%d].lora_name" % i)
        keep.extend((hashes, tokens, lora))
        e = c[i]
        e.hashes, e.hash_count = hashes, len(b.hashes)
        e.token_ids, e.token_count = tokens, len(b.token_ids)
        e.block_size = unsigned(b.block_size, 32, "blocks[%d].block_size" % i)
        e.hashes_signed = 1 if b.signed else 0
        if b.parent_hash is not None:
            e.has_parent, e.parent_hash = 1, b.parent_hash & U64_MASK
        e.lora_name.data = ctypes.cast(ctypes.c_char_p(lora), ctypes.c_void_p)
        e.lora_name.size = len(lora)
    return c


def code_of(value):
    """The ErrorCode of a wire value (INTERNAL for values this package does not know)."""
    return _CODES[value] if 0 <= value < len(_CODES) else ErrorCode.INTERNAL


def text(pointer, size):
    """``size`` bytes at ``pointer`` as str ("" when size is 0)."""
    return ctypes.string_at(pointer, size).decode("utf-8", "replace") if size else ""


def last_error(lib, code):
    """The KvError for ``code`` with this thread's kv_last_error_message()."""
    return error_for(code, (lib.kv_last_error_message() or b"").decode("utf-8", "replace"))


def key_rows(r):
    """The per-key outcomes of a kv_result_t ``r``: (rows, messages), where rows are the
    unpacked kv_key_result_t (code, exists, length, -, -) and messages maps the index of each
    key that has a message to it. Plain Python values: valid after the result is freed."""
    if not r.key_count:
        return (), {}
    rows = list(_KEY_RESULT.iter_unpack(ctypes.string_at(r.keys, r.key_count * _KEY_RESULT.size)))
    return rows, {i: text(row[3], row[4]) for i, row in enumerate(rows) if row[4]}


def listed(r):
    """List's page of a kv_result_t: (key, size, session_id) per key. Keys and session IDs are
    UTF-8 (the store validates them) and come back as str."""
    return [(ctypes.string_at(e.key.data, e.key.size).decode("utf-8", "replace"), e.size,
             ctypes.string_at(e.session_id.data, e.session_id.size).decode("utf-8", "replace"))
            for e in (r.listed[i] for i in range(r.listed_count))]


def counters(r):
    """Stat's counters of a kv_result_t: {name: value}, or {name: text} for the counters whose
    value is a word."""
    out = {}
    for i in range(r.counter_count):
        c = r.counters[i]
        out[text(c.name, c.name_size)] = text(c.text, c.text_size) if c.text_size else c.value
    return out


def take_result(lib, code, out, make):
    """Converts and frees a kv_result_t (``out``, a POINTER(Result)); raises KvError when the
    call failed as a whole. ``make(result_struct)`` builds the Python object; it runs before
    the result is freed and must copy what it keeps."""
    if not out:
        raise last_error(lib, code)
    try:
        r = out.contents
        result = make(r)
        status, message = r.status, text(r.message, r.message_size)
    finally:
        lib.kv_result_free(out)
    if status != 0:
        raise error_for(status, message, result)
    return result
