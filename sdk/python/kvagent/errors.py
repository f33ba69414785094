"""Error codes and exceptions of the kvagent SDK.

The codes are kvagent's ErrorCode wire values (common/status.h), named exactly as
docs/semantics.md spells them. Request-level failures raise a KvError subclass; per-key outcomes are values in a
Result (see the package docstring).
"""
import enum


class ErrorCode(enum.IntEnum):
    """A kvagent status code (the C ABI's kv_status_t)."""

    OK = 0
    INVALID_PARAMS = 1
    OBJECT_NOT_FOUND = 2
    OBJECT_ALREADY_EXISTS = 3
    REPLICA_NOT_READY = 4
    OBJECT_BUSY = 5
    OBJECT_HAS_LEASE = 6
    NO_SPACE = 7
    BUFFER_OUT_OF_RANGE = 8
    TRANSFER_FAILED = 9
    TIMEOUT = 10
    AGENT_UNAVAILABLE = 11
    MASTER_UNAVAILABLE = 12
    INTERNAL = 13
    DATA_CORRUPTED = 14

    @classmethod
    def _missing_(cls, value):
        """A code from a newer library that this package does not know reads as INTERNAL."""
        return cls.INTERNAL


class KvError(Exception):
    """A kvagent call failed as a whole.

    Attributes: ``code`` (ErrorCode), ``message`` (what went wrong and what to do) and
    ``result`` (the Result with one entry per key, every key carrying the same code, or None
    when the call had no keys).
    """

    def __init__(self, code, message, result=None):
        self.code = ErrorCode(code)
        self.message = message
        self.result = result
        super().__init__("%s: %s" % (self.code.name, message) if message else self.code.name)


class InvalidParams(KvError, ValueError):
    """Arguments break docs/semantics.md's rules (found locally, before the agent sees them)."""


class ObjectNotFound(KvError):
    """No readable object under the key."""


class ObjectAlreadyExists(KvError):
    """The key is already stored (callers of put usually treat this as success)."""


class ReplicaNotReady(KvError):
    """The object is being written or replaced; retry later."""


class ObjectBusy(KvError):
    """A read holds the object; retry later."""


class ObjectHasLease(KvError):
    """A read lease protects the object; wait or remove with force=True."""


class NoSpace(KvError):
    """No room in the arena or the store's pool."""


class BufferOutOfRange(KvError):
    """A buffer is too small or does not belong to this client."""


class TransferFailed(KvError):
    """Moving the bytes between agents failed."""


class Timeout(KvError, TimeoutError):
    """No answer before the call's timeout."""


class AgentUnavailable(KvError, ConnectionError):
    """The node agent is not running, refused the client, or went away."""


class MasterUnavailable(KvError, ConnectionError):
    """The agent cannot reach the master."""


class InternalError(KvError):
    """A bug in kvagent: report it with the message."""


class DataCorrupted(KvError):
    """Every replica of the value failed its checksum and was dropped: put it again."""


_CLASSES = {
    ErrorCode.INVALID_PARAMS: InvalidParams,
    ErrorCode.OBJECT_NOT_FOUND: ObjectNotFound,
    ErrorCode.OBJECT_ALREADY_EXISTS: ObjectAlreadyExists,
    ErrorCode.REPLICA_NOT_READY: ReplicaNotReady,
    ErrorCode.OBJECT_BUSY: ObjectBusy,
    ErrorCode.OBJECT_HAS_LEASE: ObjectHasLease,
    ErrorCode.NO_SPACE: NoSpace,
    ErrorCode.BUFFER_OUT_OF_RANGE: BufferOutOfRange,
    ErrorCode.TRANSFER_FAILED: TransferFailed,
    ErrorCode.TIMEOUT: Timeout,
    ErrorCode.AGENT_UNAVAILABLE: AgentUnavailable,
    ErrorCode.MASTER_UNAVAILABLE: MasterUnavailable,
    ErrorCode.INTERNAL: InternalError,
    ErrorCode.DATA_CORRUPTED: DataCorrupted,
}


def error_for(code, message, result=None):
    """The KvError subclass instance for a non-OK ``code``."""
    code = ErrorCode(code)
    return _CLASSES.get(code, KvError)(code, message, result)
