"""Strict decoding of kvagent KV events: the conformance oracle for docs/events.md.

Decodes exactly as the strictest real consumers do (python-msgpack ``raw=False,
strict_map_key=True``, Dynamo's rmp-serde decoder, vLLM's msgspec types) and then checks the
rules docs/events.md adds for our own stream. Anything off raises ``StrictEventError`` naming the
field. Needs only Debian's python3-msgpack and python3-zmq.

Decoding::

    batch = decode_payload(payload)        # Batch(ts, events, dp_rank); events are dicts
    assert_canonical(payload)              # bytes == python-msgpack's own encoding

Live stream and replay (every socket is closed on exit)::

    with Subscriber("tcp://127.0.0.1:5557") as sub:
        msg = sub.recv(timeout_ms=1000)    # Message(topic, seq, payload, batch) or None
        msgs = sub.collect_until(last_seq, timeout_ms=10000)
    check_contiguous([m.seq for m in msgs])
    history = replay("tcp://127.0.0.1:5558", start_seq=0)   # 4-frame layout + end marker

Other tests (master, agent end to end) import this module: keep the API small and stable.
From another folder: ``sys.path.insert(0, "<repo>/tests/python"); import strict_events``.
"""

import collections
import time

import msgpack
import zmq

__all__ = [
    "StrictEventError", "Batch", "Message", "decode_payload", "check_event", "assert_canonical",
    "parse_live_frames", "check_contiguous", "Subscriber", "replay", "END_SEQ",
    "KNOWN_TYPES", "MAX_SESSION_ID_BYTES",
]

END_SEQ = 2**64 - 1
END_SEQ_FRAME = b"\xff" * 8
KNOWN_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
MAX_SESSION_ID_BYTES = 256

# Keys per type, in the order docs/events.md lists them ("type" first); optional ones last.
_REQUIRED = {
    "BlockStored": ("type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                    "lora_id", "medium", "lora_name"),
    "BlockRemoved": ("type", "block_hashes", "medium"),
    "AllBlocksCleared": ("type",),
}
_OPTIONAL = {
    "BlockStored": ("group_idx", "session_id", "object_key"),
    "BlockRemoved": ("object_key",),
    "AllBlocksCleared": (),
}

Batch = collections.namedtuple("Batch", "ts events dp_rank")
Message = collections.namedtuple("Message", "topic seq payload batch")


class StrictEventError(ValueError):
    """A payload or frame that a strict consumer would reject (or that breaks docs/events.md)."""


def _fail(where, what):
    raise StrictEventError(f"{where}: {what}")


def _is_int(x):
    return type(x) is int  # bool is an int subclass; msgpack's true/false are not integers


def _pairs_to_dict(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise StrictEventError(f"duplicate map key {k!r}")
        d[k] = v
    return d


def _check_hash(x, where):
    if not _is_int(x):
        _fail(where, f"hash must be an int (int64 or uint64, never bin), got {type(x).__name__}")
    if not -2**63 <= x < 2**64:
        _fail(where, f"hash {x} is outside [-2**63, 2**64)")


def _check_str(x, where):
    if type(x) is not str:
        _fail(where, f"must be str, got {type(x).__name__}")


def check_event(ev, where="event", strict_keys=True):
    """Checks one decoded event dict against docs/events.md.

    strict_keys: also reject keys docs/events.md does not list and require its key order ("type"
    first). Real consumers ignore unknown keys; our own stream must not have any.
    """
    if not isinstance(ev, dict):
        _fail(where, f"event must be a map, got {type(ev).__name__}"
                     + (" (legacy array form)" if isinstance(ev, list) else ""))
    if "type" not in ev:
        _fail(where, "missing 'type'")
    etype = ev["type"]
    if etype not in KNOWN_TYPES:
        _fail(where + ".type", f"unknown type {etype!r}")
    where = f"{where} ({etype})"
    for key in _REQUIRED[etype]:
        if key not in ev:
            _fail(where, f"missing required key {key!r}")
    if "session_id" in ev and etype != "BlockStored":
        _fail(where + ".session_id", "session_id appears only on BlockStored")
    for key in _OPTIONAL[etype]:
        if key in ev and ev[key] is None:
            _fail(where + "." + key, "optional key present as nil; omit it when unset")
    if strict_keys:
        order = [k for k in _REQUIRED[etype] + _OPTIONAL[etype] if k in ev]
        if list(ev) != order:
            _fail(where, f"keys {list(ev)} are not exactly docs/events.md's, in order {order}")

    if etype in ("BlockStored", "BlockRemoved"):
        hashes = ev["block_hashes"]
        if not isinstance(hashes, list):
            _fail(where + ".block_hashes", "must be a list of ints")
        for i, h in enumerate(hashes):
            _check_hash(h, f"{where}.block_hashes[{i}]")
        medium = ev["medium"]
        _check_str(medium, where + ".medium")
        if not medium or medium != medium.upper():
            _fail(where + ".medium", f"medium {medium!r} must be non-empty uppercase")
        if "object_key" in ev:
            _check_str(ev["object_key"], where + ".object_key")
    if etype != "BlockStored":
        return

    if ev["parent_block_hash"] is not None:
        _check_hash(ev["parent_block_hash"], where + ".parent_block_hash")
    tokens = ev["token_ids"]
    if not isinstance(tokens, list):
        _fail(where + ".token_ids", "must be a list of u32 (never nil; [] when unknown)")
    for i, t in enumerate(tokens):
        if not _is_int(t) or not 0 <= t < 2**32:
            _fail(f"{where}.token_ids[{i}]", f"{t!r} is not a u32")
    block_size = ev["block_size"]
    if not _is_int(block_size) or not 0 <= block_size < 2**32:
        _fail(where + ".block_size", f"{block_size!r} is not a u32")
    if tokens and len(tokens) != block_size * len(ev["block_hashes"]):
        _fail(where + ".token_ids", f"{len(tokens)} tokens != block_size {block_size} x "
                                    f"{len(ev['block_hashes'])} hashes")
    if ev["lora_id"] is not None and not _is_int(ev["lora_id"]):
        _fail(where + ".lora_id", "must be int or nil")
    if ev["lora_name"] is not None:
        _check_str(ev["lora_name"], where + ".lora_name")
    if "group_idx" in ev and not _is_int(ev["group_idx"]):
        _fail(where + ".group_idx", "must be int")
    if "session_id" in ev:
        sid = ev["session_id"]
        _check_str(sid, where + ".session_id")
        if not sid:
            _fail(where + ".session_id", "empty; an untagged object omits the key")
        if len(sid.encode("utf-8")) > MAX_SESSION_ID_BYTES:
            _fail(where + ".session_id", f"longer than {MAX_SESSION_ID_BYTES} bytes")


def decode_payload(payload, strict_keys=True):
    """Decodes one payload `[ts, events, dp_rank]` strictly; returns a Batch."""
    try:
        b = msgpack.unpackb(payload, raw=False, strict_map_key=True,
                            object_pairs_hook=_pairs_to_dict)
    except StrictEventError:
        raise
    except (ValueError, msgpack.exceptions.ExtraData, msgpack.exceptions.FormatError,
            msgpack.exceptions.StackError) as e:  # UnicodeDecodeError is a ValueError
        raise StrictEventError(f"payload: not strict msgpack: {type(e).__name__}: {e}") from e
    if not isinstance(b, list) or len(b) != 3:
        _fail("batch", f"must be an array of exactly 3 [ts, events, dp_rank], got {b!r:.80}")
    ts, events, dp_rank = b
    if type(ts) is not float:
        _fail("ts", f"must be a float64, got {type(ts).__name__}")
    if not isinstance(events, list):
        _fail("events", "must be a list")
    if dp_rank is not None and (not _is_int(dp_rank) or not -2**31 <= dp_rank < 2**31):
        _fail("dp_rank", f"must be an int32 or nil, got {dp_rank!r}")
    for i, ev in enumerate(events):
        check_event(ev, f"events[{i}]", strict_keys=strict_keys)
    return Batch(ts, events, dp_rank)


def assert_canonical(payload):
    """Checks the bytes are exactly what python-msgpack (use_bin_type=True) makes of the same
    value: smallest int/str formats, float64, str never bin, key order as decoded."""
    value = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    again = msgpack.packb(value, use_bin_type=True)
    if again != payload:
        _fail("payload", f"not canonical: got {payload.hex()[:120]}..., "
                         f"python-msgpack writes {again.hex()[:120]}...")


def _seq(frame, where):
    if len(frame) != 8:
        _fail(where, f"seq frame must be 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


def parse_live_frames(frames, decode=True):
    """[topic, seq(8 BE), payload] -> Message; exactly 3 frames."""
    if len(frames) != 3:
        _fail("live message", f"must be exactly 3 frames, got {len(frames)}")
    topic, seq, payload = frames
    batch = decode_payload(payload) if decode else None
    return Message(topic, _seq(seq, "live seq"), payload, batch)


def check_contiguous(seqs, start=None):
    """Raises unless seqs go up by exactly 1 (from `start` when given)."""
    seqs = list(seqs)
    if not seqs:
        _fail("seq", "no batches")
    if start is not None and seqs[0] != start:
        _fail("seq", f"first seq is {seqs[0]}, expected {start}")
    for a, b in zip(seqs, seqs[1:]):
        if b != a + 1:
            _fail("seq", f"{a} is followed by {b}")


class Subscriber:
    """A SUB socket subscribed to everything, decoding each batch strictly."""

    def __init__(self, endpoint, context=None, rcvhwm=100000):
        self._own_context = context is None
        self._context = context or zmq.Context()
        self.socket = self._context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, rcvhwm)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(endpoint)

    def recv(self, timeout_ms=1000):
        """The next Message, or None after timeout_ms without one."""
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        return parse_live_frames(self.socket.recv_multipart())

    def collect_until(self, last_seq, timeout_ms=10000):
        """Messages until one with seq >= last_seq; raises after timeout_ms of silence."""
        out = []
        while not out or out[-1].seq < last_seq:
            msg = self.recv(timeout_ms)
            if msg is None:
                _fail("live", f"nothing for {timeout_ms} ms while waiting for seq {last_seq}")
            out.append(msg)
        return out

    def close(self):
        self.socket.close(0)
        if self._own_context:
            self._context.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def replay(endpoint, start_seq, timeout_ms=10000, context=None, topic=None):
    """Asks a replay ROUTER for every batch from start_seq through a DEALER.

    Checks the vLLM >= 0.26 layout this project serves: each reply is exactly
    [b"", topic, seq(8 BE), payload] with seqs going up from >= start_seq, and the answer ends
    with [b"", b"", ff*8, b""]. `topic`, when given, must match every reply. Returns the
    Messages (payloads decoded strictly), without the end marker.
    """
    ctx = context or zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    try:
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(endpoint)
        dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
        out = []
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0 or not dealer.poll(left, zmq.POLLIN):
                _fail("replay", f"no end marker within {timeout_ms} ms ({len(out)} batches)")
            frames = dealer.recv_multipart()
            if len(frames) != 4 or frames[0] != b"":
                _fail("replay", f"reply must be [b'', topic, seq, payload], got {len(frames)} "
                                f"frames")
            _, t, seq_frame, payload = frames
            if seq_frame == END_SEQ_FRAME:
                if t != b"" or payload != b"":
                    _fail("replay", "end marker must be [b'', b'', ff*8, b'']")
                return out
            seq = _seq(seq_frame, "replay seq")
            if seq < start_seq or (out and seq <= out[-1].seq):
                _fail("replay", f"seq {seq} out of order (start {start_seq})")
            if topic is not None and t != topic:
                _fail("replay", f"topic {t!r} != {topic!r}")
            out.append(Message(t, seq, payload, decode_payload(payload)))
    finally:
        dealer.close(0)
        if context is None:
            ctx.term()
