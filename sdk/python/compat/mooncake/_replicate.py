"""ReplicateConfig and the enums callers import from ``mooncake.store``, and how a config
becomes kvagent write options.

Attributes are typed as in Mooncake's binding: assigning a value of the wrong type raises
TypeError at once (the binding's def_readwrite does the same). What kvagent cannot honour is
refused when a call uses the config (the call returns -600), never silently dropped, except for
placement hints (preferred segments, data type, group IDs), which only steer where Mooncake
puts bytes and have no meaning when the node agent and its master choose the pool.
"""
import copy
import enum

U64 = 1 << 64
MAX_SESSION_ID_BYTES = 256  # docs/semantics.md: one UTF-8 session ID per key, at most 256 bytes


class SoftPinAction(enum.IntEnum):
    """What a write does to the object's soft pin (Mooncake's enum, same values)."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(enum.IntEnum):
    """Mooncake's object data type tag (accepted; kvagent does not use it)."""

    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class ReplicaStatus(enum.IntEnum):
    """Mooncake's replica states (exported for callers that import the name)."""

    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


def _check_int(name, value, low, high):
    if type(value) is bool or not isinstance(value, int):
        raise TypeError("ReplicateConfig.%s must be an int, got %s" % (name, type(value).__name__))
    if not low <= value < high:
        raise TypeError("ReplicateConfig.%s must be in [%d, %d), got %d" % (name, low, high, value))
    return int(value)


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise TypeError("ReplicateConfig.%s must be a bool, got %s" % (name, type(value).__name__))
    return value


def _check_str(name, value):
    if not isinstance(value, str):
        raise TypeError("ReplicateConfig.%s must be a str, got %s" % (name, type(value).__name__))
    return value


def _check_str_list(name, value, allow_none_items=False):
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise TypeError("ReplicateConfig.%s must be a list, got %s" % (name, type(value).__name__))
    try:
        items = list(value)
    except TypeError:
        raise TypeError("ReplicateConfig.%s must be a list, got %s"
                        % (name, type(value).__name__)) from None
    for i, item in enumerate(items):
        if item is None and allow_none_items:
            continue
        if not isinstance(item, (str, bytes) if allow_none_items else str):
            raise TypeError("ReplicateConfig.%s[%d] must be a str, got %s"
                            % (name, i, type(item).__name__))
    return items


class ReplicateConfig:
    """How a write is stored: Mooncake's fields, with kvagent's meaning.

    ``replica_num`` (1): replicas on distinct agents (best effort). ``with_hard_pin``: never
    evicted. ``soft_pin_action`` / ``soft_pin_ttl_ms``: ENABLE soft-pins the object (for the
    TTL, or the master's default when None); a TTL with any other action is refused (-600), as
    Mooncake does. ``session_ids``: None, or one session ID per key of the call (str, UTF-8,
    at most 256 bytes; None or "" leaves that key untagged); the stored objects' BlockStored
    events carry them. ``group_ids``: None or one per key (checked for length; kvagent has no
    object groups). ``preferred_segment(s)``, ``preferred_nof_segments``, ``data_type``:
    placement hints, accepted and unused. ``nof_replica_num``, ``dfs_replica_num`` and
    ``prefer_alloc_in_same_node`` must stay 0/False: kvagent has no NoF, DFS or same-node
    allocation, so a write asking for them returns -600.
    """

    __slots__ = ("_replica_num", "_nof_replica_num", "_dfs_replica_num", "_soft_pin_action",
                 "_soft_pin_ttl_ms", "_with_hard_pin", "_preferred_segments",
                 "_preferred_nof_segments", "_preferred_segment", "_prefer_alloc_in_same_node",
                 "_data_type", "_group_ids", "_session_ids")

    def __init__(self):
        self._replica_num = 1
        self._nof_replica_num = 0
        self._dfs_replica_num = 0
        self._soft_pin_action = SoftPinAction.PRESERVE
        self._soft_pin_ttl_ms = None
        self._with_hard_pin = False
        self._preferred_segments = []
        self._preferred_nof_segments = []
        self._preferred_segment = ""
        self._prefer_alloc_in_same_node = False
        self._data_type = ObjectDataType.UNKNOWN
        self._group_ids = None
        self._session_ids = None

    # ---- typed attributes (assignments are checked like the binding's) ------------------

    replica_num = property(lambda s: s._replica_num,
                           lambda s, v: setattr(s, "_replica_num", _check_int("replica_num", v, 0, U64)))
    nof_replica_num = property(
        lambda s: s._nof_replica_num,
        lambda s, v: setattr(s, "_nof_replica_num", _check_int("nof_replica_num", v, 0, U64)))
    dfs_replica_num = property(
        lambda s: s._dfs_replica_num,
        lambda s, v: setattr(s, "_dfs_replica_num", _check_int("dfs_replica_num", v, 0, U64)))
    with_hard_pin = property(lambda s: s._with_hard_pin,
                             lambda s, v: setattr(s, "_with_hard_pin", _check_bool("with_hard_pin", v)))
    prefer_alloc_in_same_node = property(
        lambda s: s._prefer_alloc_in_same_node,
        lambda s, v: setattr(s, "_prefer_alloc_in_same_node",
                             _check_bool("prefer_alloc_in_same_node", v)))
    preferred_segment = property(
        lambda s: s._preferred_segment,
        lambda s, v: setattr(s, "_preferred_segment", _check_str("preferred_segment", v)))
    preferred_segments = property(
        lambda s: s._preferred_segments,
        lambda s, v: setattr(s, "_preferred_segments",
                             _check_str_list("preferred_segments", v) or []))
    preferred_nof_segments = property(
        lambda s: s._preferred_nof_segments,
        lambda s, v: setattr(s, "_preferred_nof_segments",
                             _check_str_list("preferred_nof_segments", v) or []))
    group_ids = property(lambda s: s._group_ids,
                         lambda s, v: setattr(s, "_group_ids", _check_str_list("group_ids", v)))

    @property
    def session_ids(self):
        """None, or one session ID per key of the call (None or "" = untagged)."""
        return self._session_ids

    @session_ids.setter
    def session_ids(self, value):
        self._session_ids = _check_str_list("session_ids", value, allow_none_items=True)

    @property
    def soft_pin_action(self):
        return self._soft_pin_action

    @soft_pin_action.setter
    def soft_pin_action(self, value):
        if not isinstance(value, SoftPinAction):
            raise TypeError("ReplicateConfig.soft_pin_action must be a SoftPinAction, got %s"
                            % type(value).__name__)
        self._soft_pin_action = value

    @property
    def soft_pin_ttl_ms(self):
        """None (the master's default) or milliseconds >= 0."""
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, value):
        self._soft_pin_ttl_ms = None if value is None else _check_int("soft_pin_ttl_ms", value,
                                                                       0, U64)

    @property
    def data_type(self):
        return self._data_type

    @data_type.setter
    def data_type(self, value):
        if not isinstance(value, ObjectDataType):
            raise TypeError("ReplicateConfig.data_type must be an ObjectDataType, got %s"
                            % type(value).__name__)
        self._data_type = value

    # ---- copies and text ----------------------------------------------------------------

    def __copy__(self):
        twin = ReplicateConfig.__new__(ReplicateConfig)
        for name in ReplicateConfig.__slots__:
            value = getattr(self, name)
            setattr(twin, name, list(value) if isinstance(value, list) else value)
        return twin

    def __deepcopy__(self, memo):
        twin = ReplicateConfig.__new__(ReplicateConfig)
        for name in ReplicateConfig.__slots__:
            setattr(twin, name, copy.deepcopy(getattr(self, name), memo))
        return twin

    def __eq__(self, other):
        if not isinstance(other, ReplicateConfig):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in ReplicateConfig.__slots__)

    __hash__ = None

    def __str__(self):
        return ("ReplicateConfig: { replica_num: %d, with_hard_pin: %s, soft_pin_action: %s, "
                "soft_pin_ttl_ms: %s, preferred_segment: %r, group_ids: %s, session_ids: %s }"
                % (self._replica_num, self._with_hard_pin, self._soft_pin_action.name,
                   self._soft_pin_ttl_ms, self._preferred_segment,
                   None if self._group_ids is None else len(self._group_ids),
                   None if self._session_ids is None else len(self._session_ids)))

    __repr__ = __str__


class WritePlan:
    """A ReplicateConfig checked for one call: the kvagent write options and the per-key
    session IDs (None when the config has none)."""

    __slots__ = ("options", "session_ids")

    def __init__(self, options, session_ids):
        self.options = options
        self.session_ids = session_ids


class ConfigRefused(ValueError):
    """The config asks for something kvagent cannot do; the call returns -600."""


def plan_write(config, key_count, upsert=False):
    """Checks ``config`` (a ReplicateConfig or None) for a write of ``key_count`` keys and
    returns its WritePlan; raises ConfigRefused (the caller returns -600) or TypeError."""
    if config is None:
        return WritePlan({}, None)
    if not isinstance(config, ReplicateConfig):
        raise TypeError("config must be a mooncake.store.ReplicateConfig, got %s"
                        % type(config).__name__)
    if config.replica_num < 1 or config.replica_num > 255:
        raise ConfigRefused("replica_num is %d; kvagent stores 1..255 replicas"
                            % config.replica_num)
    if config.nof_replica_num or config.dfs_replica_num:
        raise ConfigRefused("nof_replica_num/dfs_replica_num must be 0: kvagent has no NoF or "
                            "DFS replicas")
    if config.prefer_alloc_in_same_node:
        raise ConfigRefused("prefer_alloc_in_same_node is not supported (Mooncake refuses it "
                            "for writes too)")
    action, ttl = config.soft_pin_action, config.soft_pin_ttl_ms
    if ttl is not None and action != SoftPinAction.ENABLE:
        raise ConfigRefused("soft_pin_ttl_ms is only valid with SoftPinAction.ENABLE")
    if ttl is not None and ttl > 0xFFFFFFFF:
        raise ConfigRefused("soft_pin_ttl_ms %d is above kvagent's limit of 2^32-1 ms" % ttl)
    if config.group_ids is not None and len(config.group_ids) != key_count:
        raise ConfigRefused("%d group_ids for %d keys; give one per key"
                            % (len(config.group_ids), key_count))
    sessions = config.session_ids
    if sessions is not None:
        if len(sessions) != key_count:
            raise ConfigRefused("%d session_ids for %d keys; give one per key (None or \"\" "
                                "for untagged)" % (len(sessions), key_count))
        # Checked here, before any byte moves, because a call may be sent in several
        # batches: a bad ID must refuse the whole call, not the batches after it.
        for i, s in enumerate(sessions):
            if s is None:
                continue
            try:
                raw = s if isinstance(s, bytes) else s.encode("utf-8")
                raw.decode("utf-8")
            except UnicodeError:
                raise ConfigRefused("session_ids[%d] is not valid UTF-8" % i) from None
            if len(raw) > MAX_SESSION_ID_BYTES:
                raise ConfigRefused("session_ids[%d] is %d bytes; the limit is %d"
                                    % (i, len(raw), MAX_SESSION_ID_BYTES))
    options = {}
    if config.replica_num != 1:
        options["replica_count"] = config.replica_num
    if config.with_hard_pin:
        options["hard_pin"] = True
    if action == SoftPinAction.ENABLE:
        options["soft_pin"] = True
        if ttl:
            options["soft_pin_ttl_ms"] = ttl
    del upsert  # PRESERVE and DISABLE both mean "no soft pin requested" for a kvagent write
    return WritePlan(options, sessions)
