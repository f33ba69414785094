#!/usr/bin/python3
"""``mooncake.store`` on kvagent driven the way SGLang's HiCache L3 backend drives Mooncake: a
host KV pool in a CPU tensor (python3-torch) is registered with register_buffer, pages are
written with batch_is_exist + batch_put_from (only the missing ones; page-first K/V pools) or
batch_put_from_multi_buffers (layer-first pools: one buffer per layer), and read back with
batch_get_into / batch_get_into_multi_buffers into other pages of the pool, byte for byte.

Environment: see mooncake_fixtures.py.
"""
import ctypes
import unittest

import torch

from mooncake.store import MooncakeHostMemAllocator, ReplicateConfig
from mooncake_fixtures import AgentTestCase, wait_until


class HostPool:
    """A host KV pool in one CPU tensor, addressed by token index; a page is ``page_size``
    consecutive tokens. ``token_dim`` is the tensor dimension that counts tokens."""

    token_dim = 0

    def __init__(self, kv_buffer, page_size):
        self.kv_buffer = kv_buffer
        self.page_size = page_size

    def _rows(self, first_page, count):
        index = [slice(None)] * self.token_dim
        index.append(slice(first_page * self.page_size, (first_page + count) * self.page_size))
        return tuple(index)

    def fill(self, first_page, count, seed):
        """Random values (a fixed generator per seed) in ``count`` pages."""
        g = torch.Generator().manual_seed(seed)
        rows = self._rows(first_page, count)
        values = torch.randn(self.kv_buffer[rows].shape, generator=g)
        self.kv_buffer[rows] = values.to(self.kv_buffer.dtype)

    def pages(self, first_page, count):
        return self.kv_buffer[self._rows(first_page, count)]

    def indices(self, first_page, count):
        start = first_page * self.page_size
        return torch.arange(start, start + count * self.page_size)


def mooncake_tensor(shape, dtype, allocator):
    """A zeroed tensor in memory from MooncakeHostMemAllocator, as SGLang's
    MooncakeHostTensorAllocator builds its host pool (torch.frombuffer over the address)."""
    size = int(torch.tensor([], dtype=dtype).element_size())
    for d in shape:
        size *= d
    address = allocator.alloc(size)
    assert address, "the allocator has no memory"
    array = (ctypes.c_byte * size).from_address(address)
    return torch.frombuffer(array, dtype=torch.uint8, count=size).view(dtype).view(shape)


class PageFirstHostPool(HostPool):
    """A page-first MHA host pool: K and V planes, each [tokens, layers, heads, head_dim];
    one page (``page_size`` tokens of every layer) is contiguous in each plane. With an
    ``allocator`` (MooncakeHostMemAllocator) the pool lives in its memory."""

    token_dim = 1

    def __init__(self, pages, page_size=16, layers=4, heads=2, head_dim=64,
                 dtype=torch.bfloat16, allocator=None):
        shape = (2, pages * page_size, layers, heads, head_dim)
        tensor = (torch.zeros(shape, dtype=dtype) if allocator is None
                  else mooncake_tensor(shape, dtype, allocator))
        super().__init__(tensor, page_size)
        self.page_bytes = page_size * layers * heads * head_dim * self.kv_buffer.element_size()

    def page_buffer_meta(self, indices):
        """(pointers, sizes): K then V of each page of ``indices`` (token indices)."""
        ptrs, sizes = [], []
        for start in indices[::self.page_size].tolist():
            ptrs += [self.kv_buffer[0, start].data_ptr(), self.kv_buffer[1, start].data_ptr()]
            sizes += [self.page_bytes, self.page_bytes]
        return ptrs, sizes


class LayerFirstHostPool(HostPool):
    """A layer-first MLA host pool [layers, tokens, dim]: a page is one buffer per layer."""

    token_dim = 1

    def __init__(self, pages, page_size=16, layers=6, dim=96, dtype=torch.float16):
        super().__init__(torch.zeros((layers, pages * page_size, dim), dtype=dtype), page_size)
        self.layer_bytes = page_size * dim * self.kv_buffer.element_size()

    def page_buffer_meta(self, indices):
        """(pointers, sizes): one list per page, one entry per layer."""
        layers = self.kv_buffer.shape[0]
        ptrs, sizes = [], []
        for start in indices[::self.page_size].tolist():
            ptrs.append([self.kv_buffer[l, start].data_ptr() for l in range(layers)])
            sizes.append([self.layer_bytes] * layers)
        return ptrs, sizes


class HiCacheLikeBackend:
    """The calls an L3 backend makes, in its order: register the pool once; on a backup, ask
    which page objects exist and put only the missing ones (each object tagged with its
    request's session and its page's group); on a prefetch, read the pages into the pool.
    Page object keys are "<page hash>_<rank>_k" / "_v" (K/V pools) or "<page hash>__k"."""

    def __init__(self, store, pool, rank=0):
        self.store, self.pool, self.rank = store, pool, rank
        self.multi = isinstance(pool, LayerFirstHostPool)
        self.puts = 0  # put calls made (what dedupe saves)
        t = pool.kv_buffer
        assert store.register_buffer(t.data_ptr(), t.numel() * t.element_size()) == 0

    def object_keys(self, page_hashes):
        if self.multi:
            return [f"{h}__k" for h in page_hashes]
        return [f"{h}_{self.rank}_{s}" for h in page_hashes for s in ("k", "v")]

    @property
    def per_page(self):
        return 1 if self.multi else 2

    def exists(self, page_hashes):
        """How many leading pages are stored (every object of the page)."""
        keys = self.object_keys(page_hashes)
        found = self.store.batch_is_exist(keys)
        for i, state in enumerate(found):
            if state != 1:
                return i // self.per_page
        return len(page_hashes)

    def backup(self, page_hashes, indices, session):
        keys = self.object_keys(page_hashes)
        ptrs, sizes = self.pool.page_buffer_meta(indices)
        state = self.store.batch_is_exist(keys)
        missing = [i for i, s in enumerate(state) if s != 1]
        results = [0 if s == 1 else -1 for s in state]
        if missing:
            config = ReplicateConfig()
            config.group_ids = [f"hicache:{keys[i].rsplit('_', 2)[0]}" for i in missing]
            config.session_ids = [session] * len(missing)
            put = (self.store.batch_put_from_multi_buffers if self.multi
                   else self.store.batch_put_from)
            self.puts += 1
            codes = put([keys[i] for i in missing], [ptrs[i] for i in missing],
                        [sizes[i] for i in missing], config)
            for i, code in zip(missing, codes):
                results[i] = code
        return [all(r == 0 for r in results[p * self.per_page:(p + 1) * self.per_page])
                for p in range(len(page_hashes))]

    def prefetch(self, page_hashes, indices):
        keys = self.object_keys(page_hashes)
        ptrs, sizes = self.pool.page_buffer_meta(indices)
        get = (self.store.batch_get_into_multi_buffers if self.multi
               else self.store.batch_get_into)
        results = get(keys, ptrs, sizes)
        self.last_results = results
        return [all(r > 0 for r in results[p * self.per_page:(p + 1) * self.per_page])
                for p in range(len(page_hashes))]


def hashes(prefix, count):
    return ["%s%060x" % (prefix, i) for i in range(count)]


class HostPoolTest(AgentTestCase):
    pool = "256MiB"

    def round_trip(self, pool):
        store = self.store()
        backend = HiCacheLikeBackend(store, pool)
        pool.fill(0, 32, seed=1)
        pages = hashes("ab", 32)
        self.assertEqual(backend.exists(pages), 0)
        self.assertEqual(backend.backup(pages, pool.indices(0, 32), "req-1"), [True] * 32)
        self.assertEqual(backend.exists(pages), 32)
        # Read into pages 32..63, which hold zeros: byte-exact copies of pages 0..31.
        self.assertFalse(torch.equal(pool.pages(32, 32), pool.pages(0, 32)))
        self.assertEqual(backend.prefetch(pages, pool.indices(32, 32)), [True] * 32)
        self.assertTrue(torch.equal(pool.pages(32, 32), pool.pages(0, 32)))
        return store, backend, pages

    def test_page_first_pool_round_trip_through_batch_put_from_and_batch_get_into(self):
        pool = PageFirstHostPool(pages=64)
        _, backend, _ = self.round_trip(pool)
        self.assertEqual(backend.last_results, [pool.page_bytes] * 64)

    def test_a_pool_from_the_mooncake_allocator_round_trips_without_a_copy_here(self):
        allocator = MooncakeHostMemAllocator()
        pool = PageFirstHostPool(pages=64, allocator=allocator)
        _, backend, _ = self.round_trip(pool)
        self.assertEqual(backend.last_results, [pool.page_bytes] * 64)

    def test_a_pools_pages_are_stored_and_read_again_after_the_agent_restarts(self):
        # The pool's own client never reconnected: after the agent restarted, every put and
        # get of its pages answered -900 until the engine restarted. Its pages now go through
        # the store's connection, which reconnects.
        store = self.store()
        pool = store.alloc_from_mem_pool(1 << 20)
        self.assertNotEqual(pool, 0)
        self.assertEqual(store.register_buffer(pool, 1 << 20), 0)
        ctypes.memset(pool, 7, 4096)
        self.assertEqual(store.batch_put_from(["before"], [pool], [4096]), [0])
        self.agent.kill()
        self.agent.start()
        self.assertTrue(wait_until(
            lambda: store.batch_put_from(["after"], [pool], [4096]) == [0]))
        ctypes.memset(pool + 4096, 0, 4096)
        self.assertEqual(store.batch_get_into(["after"], [pool + 4096], [4096]), [4096])
        self.assertEqual(ctypes.string_at(pool + 4096, 4096), b"\x07" * 4096)

    def test_layer_first_pool_round_trip_through_the_multi_buffer_calls(self):
        pool = LayerFirstHostPool(pages=64)
        _, backend, _ = self.round_trip(pool)
        self.assertEqual(backend.last_results, [pool.layer_bytes * 6] * 32)

    def test_stored_pages_are_not_put_again_and_a_put_keeps_the_first_value(self):
        pool = PageFirstHostPool(pages=64)
        store, backend, pages = self.round_trip(pool)
        puts = backend.puts
        self.assertEqual(backend.backup(pages, pool.indices(0, 32), "req-2"), [True] * 32)
        self.assertEqual(backend.puts, puts)  # every object existed: no put call at all
        more = pages[16:] + hashes("cd", 16)  # half stored, half new
        pool.fill(0, 32, seed=2)
        self.assertEqual(backend.backup(more, pool.indices(0, 32), "req-3"), [True] * 32)
        self.assertEqual(backend.puts, puts + 1)
        # The stored half kept its first bytes: a direct put of new bytes answers 0 and
        # changes nothing (put-if-absent).
        keys = backend.object_keys(pages[:1])
        ptrs, sizes = pool.page_buffer_meta(pool.indices(0, 1))
        self.assertEqual(store.batch_put_from(keys, ptrs, sizes), [0, 0])
        reread = PageFirstHostPool(pages=64)
        HiCacheLikeBackend(store, reread).prefetch(pages, reread.indices(0, 32))
        original = PageFirstHostPool(pages=64)
        original.fill(0, 32, seed=1)
        self.assertTrue(torch.equal(reread.pages(0, 32), original.pages(0, 32)))

    def test_misses_read_nothing_and_raise_nothing(self):
        pool = PageFirstHostPool(pages=8)
        store = self.store()
        backend = HiCacheLikeBackend(store, pool)
        pool.fill(0, 8, seed=3)
        before = pool.kv_buffer.clone()
        self.assertEqual(backend.prefetch(hashes("ef", 8), pool.indices(0, 8)), [False] * 8)
        self.assertEqual(backend.last_results, [-704] * 16)
        self.assertTrue(torch.equal(pool.kv_buffer, before))
        self.assertEqual(backend.exists(hashes("ef", 8)), 0)

    def test_a_value_read_by_get_buffer_is_a_tensor_without_a_copy(self):
        pool = PageFirstHostPool(pages=4)
        store = self.store()
        backend = HiCacheLikeBackend(store, pool)
        pool.fill(0, 1, seed=4)
        pages = hashes("aa", 1)
        self.assertEqual(backend.backup(pages, pool.indices(0, 1), "req"), [True])
        handle = store.get_buffer(backend.object_keys(pages)[0])
        tensor = torch.frombuffer(handle, dtype=torch.bfloat16)
        self.assertTrue(torch.equal(tensor, pool.kv_buffer[0, 0:16].flatten()))
        self.assertEqual(tensor.data_ptr(), handle.ptr())

    def test_each_page_object_carries_its_requests_session_on_the_events(self):
        pool = PageFirstHostPool(pages=16)
        store = self.store()
        backend = HiCacheLikeBackend(store, pool)
        pool.fill(0, 16, seed=5)
        first, second = hashes("0a", 8), hashes("0b", 8)
        backend.backup(first, pool.indices(0, 8), "会话-α")
        backend.backup(first[4:] + second, pool.indices(4, 12), "session-β")
        expect = {k: "会话-α" for k in backend.object_keys(first)}
        expect.update({k: "session-β" for k in backend.object_keys(second)})
        self.assertTrue(wait_until(lambda: len(self.agent.stored_sessions()) >= len(expect)))
        self.assertEqual(self.agent.stored_sessions(), expect)


if __name__ == "__main__":
    unittest.main(verbosity=2)
