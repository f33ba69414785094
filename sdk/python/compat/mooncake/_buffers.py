"""Memory the compat hands out or is told about: BufferHandle (get_buffer's result), the table
of registered buffers, and MooncakeHostMemAllocator."""
import ctypes
import functools
import logging
import mmap
import threading

log = logging.getLogger("mooncake.store")


class BufferHandle:
    """A value read by get_buffer/batch_get_buffer: ``ptr()`` (int address), ``size()`` and
    ``len()`` in bytes, and the buffer protocol (``bytes(h)``, ``memoryview(h)``,
    ``torch.frombuffer(h, dtype=torch.uint8)``). The bytes live in the client's shared-memory
    arena (the agent wrote them there: no copy after the read) and stay valid while the handle
    or any view of it is alive."""

    __slots__ = ()

    def ptr(self):
        return ctypes.addressof(self)

    def size(self):
        return len(self)


@functools.lru_cache(maxsize=512)
def _handle_type(size):
    # The buffer protocol comes from a ctypes array of the value's size; one type per size
    # (engines use a handful of page sizes, so the cache stays small).
    return type("BufferHandle", (BufferHandle, ctypes.c_ubyte * size), {"__slots__": ()})


def handle_over(arena_buffer, length):
    """A BufferHandle over the first ``length`` bytes of a kvagent ArenaBuffer, keeping the
    buffer alive."""
    view = arena_buffer.view()
    address = ctypes.addressof(ctypes.c_ubyte.from_buffer(view)) if length else 0
    handle = _handle_type(length).from_address(address) if length else _handle_type(0)()
    handle._owner = (arena_buffer, view)  # the arena range is returned when the handle dies
    return handle


class RegisteredBuffers:
    """The buffers a caller registered (register_buffer). kvagent needs no registration to read
    or write a caller's memory; the table keeps Mooncake's contract (unregistering an address
    that was not registered fails) and says whether a range lies in registered memory."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sizes = {}

    def add(self, address, size):
        with self._lock:
            self._sizes[address] = size

    def remove(self, address):
        with self._lock:
            return self._sizes.pop(address, None) is not None

    def clear(self):
        with self._lock:
            self._sizes.clear()

    def capacity_at(self, address):
        """Bytes from ``address`` to the end of the registered buffer holding it (0 when no
        registered buffer holds it)."""
        with self._lock:
            for a, s in self._sizes.items():
                if a <= address < a + s:
                    return a + s - address
        return 0


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


class HostPools:
    """Host memory handed out from kvagent shared memory: each pool is the arena of a kvagent
    client of its own, so a value in it is already where the agent reads and writes values —
    no copy on this side, one copy by the agent between the arena and the node pool. Pools are
    registered here (process-wide) so that the store sends the keys whose bytes lie in a pool
    through that pool's client."""

    _lock = threading.Lock()
    _pools = {}  # address -> (size, kvagent.Client, ArenaBuffer)

    @classmethod
    def create(cls, size, run_dir):
        """A new pool of ``size`` bytes: its address, or 0 when the agent cannot give an arena
        that large (not running, or its --max-arena-bytes is smaller)."""
        import kvagent
        try:
            client = kvagent.Client(run_dir=run_dir, name="mooncake-host-pool",
                                    arena_bytes=size)
        except kvagent.KvError as e:
            log.warning("host pool of %d bytes not in kvagent shared memory (%s)", size, e)
            return 0
        if client.arena_bytes < size:
            log.warning("host pool of %d bytes not in kvagent shared memory: the agent grants "
                        "arenas of at most %d bytes (raise its --max-arena-bytes)", size,
                        client.arena_bytes)
            client.close()
            return 0
        buffer = client.allocate(size)
        with cls._lock:
            cls._pools[buffer.address] = (size, client, buffer)
        return buffer.address

    @classmethod
    def release(cls, address):
        """Frees a pool; False when ``address`` is not one."""
        with cls._lock:
            pool = cls._pools.pop(address, None)
        if pool is None:
            return False
        _, client, buffer = pool
        buffer.close()
        client.close()
        return True

    @classmethod
    def owners(cls, sources, todo):
        """{client: [indices]} for the keys of ``todo`` whose source is one (address, size)
        range inside a pool, and the list of the other indices."""
        with cls._lock:
            pools = [(base, base + size, client) for base, (size, client, _) in cls._pools.items()]
        if not pools:
            return {}, list(todo)
        owned, rest = {}, []
        for i in todo:
            src = sources[i]
            client = None
            if type(src) is list and len(src) == 1:
                address, size = src[0]
                for start, end, c in pools:
                    if start <= address and address + size <= end:
                        client = c
                        break
            if client is None:
                rest.append(i)
            else:
                owned.setdefault(client, []).append(i)
        return owned, rest


class MooncakeHostMemAllocator:
    """Host memory for an engine's KV pool: ``alloc(size)`` returns the address (int) of
    ``size`` zeroed bytes, or 0 when the system has none; ``free(address)`` gives them back (0
    on success, -1 for an address this allocator did not hand out). As with Mooncake's
    allocator, the memory is shared with the store: it is the shared-memory arena of a kvagent
    client of its own (HostPools), so puts and gets of pages in it copy once, inside the agent,
    at memory speed. When the agent cannot give an arena that large (KVAGENT_RUN_DIR's agent
    not running, or --max-arena-bytes smaller) it is plain anonymous memory, which kvagent reads
    and writes like any other memory of the process."""

    def __init__(self, run_dir=None):
        self._run_dir = run_dir
        self._lock = threading.Lock()
        self._sizes = {}  # plain memory: address -> size
        self._pools = set()  # addresses of the HostPools it created

    def alloc(self, size):
        if type(size) is bool or not isinstance(size, int) or size <= 0:
            raise TypeError("alloc(size): size must be an int > 0")
        from . import _setup
        address = HostPools.create(size, self._run_dir or _setup.default_run_dir())
        if address:
            with self._lock:
                self._pools.add(address)
            return address
        address = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE,
                             mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if address is None or address == _MAP_FAILED:
            return 0
        with self._lock:
            self._sizes[address] = size
        return address

    def free(self, address):
        with self._lock:
            pooled = address in self._pools
            self._pools.discard(address)
        if pooled and HostPools.release(address):
            return 0
        with self._lock:
            size = self._sizes.pop(address, None)
        if size is None:
            return -1
        _libc.munmap(address, size)
        return 0

    def free_all(self):
        """Frees everything this allocator handed out."""
        with self._lock:
            sizes, self._sizes = self._sizes, {}
            pools, self._pools = self._pools, set()
        for address, size in sizes.items():
            _libc.munmap(address, size)
        for address in pools:
            HostPools.release(address)
