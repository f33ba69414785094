"""Memory the compat hands out or is told about: BufferHandle (get_buffer's result), the table
of registered buffers, and MooncakeHostMemAllocator."""
import ctypes
import functools
import mmap
import threading


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


class MooncakeHostMemAllocator:
    """Host memory for an engine's KV pool: ``alloc(size)`` returns the address (int) of
    ``size`` zeroed, page-aligned bytes, or 0 when the system has none; ``free(address)`` gives
    them back (0 on success, -1 for an address this allocator did not hand out). Plain
    anonymous memory: kvagent reads and writes it like any other memory of the process."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sizes = {}

    def alloc(self, size):
        if type(size) is bool or not isinstance(size, int) or size <= 0:
            raise TypeError("alloc(size): size must be an int > 0")
        address = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE,
                             mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if address is None or address == _MAP_FAILED:
            return 0
        with self._lock:
            self._sizes[address] = size
        return address

    def free(self, address):
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
        for address, size in sizes.items():
            _libc.munmap(address, size)
