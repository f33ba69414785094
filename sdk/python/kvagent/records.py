"""The plain records kvagent calls take and return: Block (an argument), KeyResult and Result
(per-key outcomes), ListedKey and ListPage (List)."""
from . import _marshal as marshal
from .errors import ErrorCode

_SUCCESS = (int(ErrorCode.OK), int(ErrorCode.OBJECT_ALREADY_EXISTS))


class Block:
    """Metadata of the KV block(s) one key holds; becomes the key's BlockStored event.

    ``hashes``: at least one block hash, first block first (negative values are allowed with
    ``signed=True``, SGLang-style). ``token_ids``: none (then ``block_size`` 0), or ``block_size * len(hashes)``.
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
    do; "" when OK), ``length`` (get: the value's length), ``exists`` (exist: readable) and
    ``replicas`` (put/upsert that stored the value: replicas written, of its part with the
    fewest; fewer than asked when a peer could not be written)."""

    __slots__ = ("code", "message", "length", "exists", "replicas")

    def __init__(self, code, message, length=0, exists=False, replicas=0):
        self.code = code
        self.message = message
        self.length = length
        self.exists = exists
        self.replicas = replicas

    @property
    def ok(self):
        """True for OK, and for OBJECT_ALREADY_EXISTS (a put of a stored key succeeds)."""
        return self.code in (ErrorCode.OK, ErrorCode.OBJECT_ALREADY_EXISTS)

    def __repr__(self):
        return "KeyResult(%s%s)" % (self.code.name, ", %r" % self.message if self.message else "")


class Result:
    """The outcome of a call that was attempted: ``keys`` has one KeyResult per key of the
    request, in order; ``removed_count`` is set by remove_all. ``ok`` and ``codes`` read the
    per-key codes without building the KeyResult objects (built on first access to ``keys``).
    """

    __slots__ = ("_rows", "_messages", "_keys", "removed_count")

    def __init__(self, rows, messages, removed_count=0):
        self._rows = rows  # (code, exists, length, -, -, replicas) per key: kv_key_result_t
        self._messages = messages  # {index: message} for the keys that have one
        self._keys = None
        self.removed_count = removed_count

    @property
    def keys(self):
        """One KeyResult per key of the request, in order."""
        if self._keys is None:
            get = self._messages.get
            self._keys = [KeyResult(marshal.code_of(r[0]), get(i, ""), r[2], r[1] != 0, r[5])
                          for i, r in enumerate(self._rows)]
        return self._keys

    @property
    def codes(self):
        """The ErrorCode of every key, in order."""
        return [marshal.code_of(r[0]) for r in self._rows]

    @property
    def lengths(self):
        """Get: each key's value length, in order (without building the KeyResult objects)."""
        return [r[2] for r in self._rows]

    @property
    def ok(self):
        """True when every key succeeded (see KeyResult.ok)."""
        return all(r[0] in _SUCCESS for r in self._rows)

    def __len__(self):
        return len(self._rows)

    def __repr__(self):
        return "Result(%r)" % (self.keys,)


class ListedKey:
    """One stored object as List reports it: ``key`` (str), ``size`` (value bytes) and
    ``session_id`` ("" when untagged)."""

    __slots__ = ("key", "size", "session_id")

    def __init__(self, key, size, session_id):
        self.key = key
        self.size = size
        self.session_id = session_id

    def __repr__(self):
        return "ListedKey(%r, %d, %r)" % (self.key, self.size, self.session_id)


class ListPage:
    """One page of a List scan: ``keys`` (ListedKey each) and ``next_cursor`` (pass it to the
    next list(); 0 when the scan is complete)."""

    __slots__ = ("keys", "next_cursor")

    def __init__(self, keys, next_cursor):
        self.keys = keys
        self.next_cursor = next_cursor

    def __repr__(self):
        return "ListPage(%d keys, next_cursor=%d)" % (len(self.keys), self.next_cursor)
