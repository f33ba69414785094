#!/usr/bin/python3
"""``mooncake.store`` on kvagent (sdk/python/compat), driven as Mooncake's callers drive it:
setup forms, Mooncake's return codes (never an exception for a runtime failure), bytes and
pointer APIs byte-exact, session IDs on the agent's events (decoded strictly), a second process
reading what the first wrote, and a stopped agent answering negative codes.

Every test starts its own kvagent in a fresh run directory and always stops it.
Environment: see mooncake_fixtures.py.
"""
import copy
import ctypes
import json
import os
import subprocess
import sys
import unittest

import mooncake
from mooncake.store import (BufferHandle, MooncakeDistributedStore, MooncakeHostMemAllocator,
                            ReplicateConfig, SoftPinAction)
from mooncake_fixtures import AgentTestCase, setup_args, wait_until

INVALID_PARAMS, NOT_FOUND, HAS_LEASE, RPC_FAIL = -600, -704, -706, -900


def pattern(seed, size):
    """``size`` bytes that differ from seed to seed and from byte to byte."""
    return bytes((seed * 131 + i * 7 + (i >> 8)) & 0xFF for i in range(size))


class Memory:
    """A ctypes buffer of this process, filled from bytes, with its address."""

    def __init__(self, size, fill=None):
        self.array = (ctypes.c_ubyte * size)()
        self.address = ctypes.addressof(self.array)
        self.size = size
        if fill is not None:
            ctypes.memmove(self.address, fill, len(fill))

    def read(self, offset, size):
        return ctypes.string_at(self.address + offset, size)


class ReplicateConfigTest(unittest.TestCase):
    def test_this_is_the_kvagent_package(self):
        self.assertTrue(mooncake.KVAGENT_COMPAT)

    def test_defaults_and_typed_attributes_as_the_binding(self):
        c = ReplicateConfig()
        self.assertEqual((c.replica_num, c.with_hard_pin, c.soft_pin_action, c.soft_pin_ttl_ms,
                          c.preferred_segment, c.group_ids, c.session_ids),
                         (1, False, SoftPinAction.PRESERVE, None, "", None, None))
        c.soft_pin_ttl_ms = 1000
        self.assertEqual(c.soft_pin_ttl_ms, 1000)
        c.soft_pin_ttl_ms = None
        for bad in (-1, 1 << 64, "10"):
            with self.assertRaises(TypeError):
                c.soft_pin_ttl_ms = bad
        with self.assertRaises(TypeError):
            c.replica_num = "3"
        with self.assertRaises(TypeError):
            c.session_ids = "one string is not a list"
        with self.assertRaises(TypeError):
            c.session_ids = ["ok", 7]
        c.replica_num = 3
        self.assertIn("3", str(c))

    def test_a_copy_keeps_every_field_and_owns_its_lists(self):
        c = ReplicateConfig()
        c.replica_num = 2
        c.with_hard_pin = True
        c.soft_pin_action = SoftPinAction.ENABLE
        c.soft_pin_ttl_ms = 500
        c.preferred_segments = ["node-1"]
        c.group_ids = ["g", "g"]
        c.session_ids = ["会话-1", None]
        for twin in (copy.copy(c), copy.deepcopy(c)):
            self.assertEqual(twin, c)
            self.assertEqual(twin.session_ids, ["会话-1", None])
            twin.session_ids.append("x")
            self.assertEqual(c.session_ids, ["会话-1", None])


class SetupTest(AgentTestCase):
    def test_positional_setup_as_sglang_calls_it(self):
        store = MooncakeDistributedStore()
        self.assertEqual(store.setup(*setup_args(), None), 0)  # engine=None, as SGLang passes
        self.addCleanup(store.close)
        self.assertEqual(store.put("k", b"v"), 0)
        self.assertEqual(store.get_hostname(), "localhost")
        self.assertEqual(store.health_check(), 0)

    def test_dict_setup_reads_human_readable_sizes_and_refuses_a_percentage(self):
        good = {"local_hostname": "node-a", "metadata_server": "P2PHANDSHAKE",
                "global_segment_size": "16MB", "local_buffer_size": "16 MB", "protocol": "tcp",
                "rdma_devices": "", "master_server_addr": "127.0.0.1:50051"}
        store = MooncakeDistributedStore()
        self.addCleanup(store.close)
        self.assertEqual(store.setup(good), 0)
        self.assertEqual(store.put("dict-key", b"value"), 0)
        self.assertEqual(store.get("dict-key"), b"value")
        self.assertEqual(store.get_hostname(), "node-a")
        for bad in ({**good, "global_segment_size": "50%"}, {**good, "local_hostname": ""},
                    {**good, "enable_ssd_offload": "true"}, {**good, "tenant_id": "other"}):
            self.assertEqual(MooncakeDistributedStore().setup(bad), INVALID_PARAMS, bad)

    def test_an_unsupported_keyword_raises_type_error_naming_it_and_a_retry_works(self):
        store = MooncakeDistributedStore()
        self.addCleanup(store.close)
        kwargs = {"enable_ssd_offload": True, "enable_client_http_server": True,
                  "client_http_port": 9400}
        attempts = 0
        while True:  # SGLang's loop: drop each keyword the TypeError names, then retry
            attempts += 1
            try:
                ret = store.setup(*setup_args(), None, **kwargs)
                break
            except TypeError as e:
                named = [k for k in kwargs if k in str(e)]
                self.assertTrue(named, str(e))
                for k in named:
                    kwargs.pop(k)
        self.assertEqual((ret, kwargs, attempts), (0, {}, 4))
        # Keywords at their default values are accepted; unknown ones are refused.
        self.assertEqual(store.setup(*setup_args(), None, enable_ssd_offload=False,
                                     tenant_id="default"), 0)
        with self.assertRaises(TypeError) as caught:
            store.setup(*setup_args(), no_such_option=1)
        self.assertIn("no_such_option", str(caught.exception))

    def test_setup_without_arguments_reads_mooncake_config_path_then_mooncake_env(self):
        path = os.path.join(self.tmp, "mooncake.json")
        with open(path, "w") as f:
            json.dump({"local_hostname": "from-file", "metadata_server": "P2PHANDSHAKE",
                       "master_server_address": "127.0.0.1:50051",
                       "local_buffer_size": "128MB"}, f)
        env = {"MOONCAKE_CONFIG_PATH": path}
        saved = {k: os.environ.get(k) for k in ("MOONCAKE_CONFIG_PATH", "MOONCAKE_MASTER",
                                                "MOONCAKE_LOCAL_HOSTNAME")}
        self.addCleanup(lambda: [os.environ.pop(k, None) if v is None
                                 else os.environ.__setitem__(k, v) for k, v in saved.items()])
        os.environ.update(env)
        store = MooncakeDistributedStore()
        self.addCleanup(store.close)
        self.assertEqual(store.setup(), 0)
        self.assertEqual(store.get_hostname(), "from-file")
        self.assertEqual(store.put("file-key", b"x"), 0)
        del os.environ["MOONCAKE_CONFIG_PATH"]
        os.environ["MOONCAKE_MASTER"] = "127.0.0.1:50051"
        os.environ["MOONCAKE_LOCAL_HOSTNAME"] = "from-env"
        self.assertEqual(store.setup(), 0)
        self.assertEqual(store.get_hostname(), "from-env")
        self.assertEqual(store.get("file-key"), b"x")
        del os.environ["MOONCAKE_MASTER"]
        self.assertEqual(store.setup(), INVALID_PARAMS)

    def test_no_agent_answers_rpc_fail_and_calls_before_setup_answer_without_raising(self):
        os.environ["KVAGENT_RUN_DIR"] = os.path.join(self.tmp, "nowhere")
        store = MooncakeDistributedStore()
        self.assertEqual(store.setup(*setup_args()), RPC_FAIL)
        fresh = MooncakeDistributedStore()
        self.assertEqual(fresh.put("k", b"v"), INVALID_PARAMS)
        self.assertEqual(fresh.get("k"), b"")
        self.assertIsNone(fresh.get_buffer("k"))
        self.assertEqual(fresh.batch_is_exist(["a", "b"]), [INVALID_PARAMS] * 2)
        self.assertEqual(fresh.batch_put_from(["a"], [1], [1]), [INVALID_PARAMS])
        self.assertEqual(fresh.health_check(), 1)
        self.assertEqual(fresh.close(), 0)


    def test_setup_without_arguments_refuses_offload_and_http_server_it_reads(self):
        """A Mooncake config file or MOONCAKE_* variables that turn on SSD offload or the client
        HTTP server make setup() answer -600, as setup(dict) does; off spelt as text is off."""
        path = os.path.join(self.tmp, "mooncake.json")
        base = {"local_hostname": "h", "metadata_server": "P2PHANDSHAKE",
                "master_server_address": "127.0.0.1:50051"}
        names = ("MOONCAKE_CONFIG_PATH", "MOONCAKE_MASTER", "MOONCAKE_OFFLOAD_ENABLED",
                 "MOONCAKE_ENABLE_CLIENT_HTTP_SERVER")
        saved = {k: os.environ.get(k) for k in names}
        self.addCleanup(lambda: [os.environ.pop(k, None) if v is None
                                 else os.environ.__setitem__(k, v) for k, v in saved.items()])
        for k in names:
            os.environ.pop(k, None)
        store = MooncakeDistributedStore()
        self.addCleanup(store.close)
        os.environ["MOONCAKE_CONFIG_PATH"] = path
        for extra, code in [({"enable_ssd_offload": True}, INVALID_PARAMS),
                            ({"ssd_offload_path": "/nvme/x"}, INVALID_PARAMS),
                            ({"enable_client_http_server": "true"}, INVALID_PARAMS),
                            ({"enable_ssd_offload": "notabool"}, INVALID_PARAMS),
                            ({"protocol": ""}, INVALID_PARAMS),
                            ({"enable_ssd_offload": "false", "ssd_offload_path": None,
                              "enable_client_http_server": "off"}, 0)]:
            with open(path, "w") as f:
                json.dump(dict(base, **extra), f)
            self.assertEqual(store.setup(), code, extra)
        del os.environ["MOONCAKE_CONFIG_PATH"]
        os.environ["MOONCAKE_MASTER"] = "127.0.0.1:50051"
        os.environ["MOONCAKE_OFFLOAD_ENABLED"] = "1"
        self.assertEqual(store.setup(), INVALID_PARAMS)
        del os.environ["MOONCAKE_OFFLOAD_ENABLED"]
        os.environ["MOONCAKE_ENABLE_CLIENT_HTTP_SERVER"] = "yes"
        self.assertEqual(store.setup(), INVALID_PARAMS)
        os.environ["MOONCAKE_ENABLE_CLIENT_HTTP_SERVER"] = "no"
        self.assertEqual(store.setup(), 0)
        self.assertEqual(store.put("cfg-key", b"v"), 0)


class MooncakeConfigTest(unittest.TestCase):
    """mooncake.mooncake_config.MooncakeConfig with Mooncake's fields and parsing (no agent)."""

    def _from_file(self, config):
        import tempfile
        from mooncake.mooncake_config import MooncakeConfig
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "c.json")
            with open(path, "w") as f:
                json.dump(dict({"local_hostname": "h", "metadata_server": "m",
                                "master_server_address": "a:1"}, **config), f)
            return MooncakeConfig.from_file(path)

    def test_offload_and_http_fields_are_read_with_text_booleans(self):
        c = self._from_file({})
        self.assertEqual((c.enable_ssd_offload, c.ssd_offload_path, c.enable_client_http_server,
                          c.client_http_port), (False, "", False, 9300))
        for text, value in [("false", False), ("0", False), ("off", False), ("no", False),
                            ("True", True), ("1", True), ("on", True), (True, True)]:
            self.assertIs(self._from_file({"enable_ssd_offload": text}).enable_ssd_offload,
                          value, text)
        with self.assertRaises(ValueError):
            self._from_file({"enable_ssd_offload": "notabool"})
        c = self._from_file({"ssd_offload_path": None, "enable_client_http_server": "enable",
                             "client_http_port": "19444"})
        self.assertEqual((c.ssd_offload_path, c.enable_client_http_server, c.client_http_port),
                         ("", True, 19444))

    def test_protocol_is_checked_and_sizes_parse(self):
        from mooncake import mooncake_config as mc
        self.assertEqual(self._from_file({"protocol": " RDMA "}).protocol, "rdma")
        for bad in ("", "   ", None):
            with self.assertRaises(ValueError):
                self._from_file({"protocol": bad})
        with self.assertLogs(mc.logger, level="WARNING"):
            self.assertEqual(self._from_file({"protocol": "Foo"}).protocol, "foo")
        self.assertEqual(mc._parse_segment_size("1.5kb"), 1536)
        self.assertEqual(mc._parse_segment_size(4096), 4096)
        with self.assertRaises(ValueError):
            mc._parse_segment_size("lots")


class BytesApiTest(AgentTestCase):
    def test_put_is_put_if_absent_and_values_come_back_byte_exact(self):
        store = self.store()
        value = pattern(1, 100_000)
        self.assertEqual(store.put("obj", value), 0)
        self.assertEqual(store.put("obj", b"something else"), 0)  # kept: put-if-absent
        self.assertEqual(store.get("obj"), value)
        self.assertEqual(store.get_size("obj"), len(value))
        self.assertEqual(store.is_exist("obj"), 1)
        # Upsert replaces, but not while a read lease holds the key (kvagent's rule).
        self.assertEqual(store.upsert("obj", b"replaced"), -714)
        self.assertEqual(store.upsert("fresh", b"first"), 0)
        self.assertEqual(store.upsert("fresh", b"replaced"), 0)
        self.assertEqual(store.get("fresh"), b"replaced")
        self.assertEqual(store.put_parts("parts", b"ab", bytearray(b"cd"), memoryview(b"ef")), 0)
        self.assertEqual(store.get("parts"), b"abcdef")
        self.assertEqual(store.put_batch(["b0", "b1"], [pattern(2, 10), pattern(3, 300_000)]), 0)
        self.assertEqual(store.get_batch(["b0", "missing", "b1"]),
                         [pattern(2, 10), b"", pattern(3, 300_000)])

    def test_buffer_handles_share_the_value_without_a_copy(self):
        store = self.store()
        store.put("h", pattern(4, 5000))
        handle = store.get_buffer("h")
        self.assertIsInstance(handle, BufferHandle)
        self.assertEqual((handle.size(), len(handle)), (5000, 5000))
        self.assertEqual(bytes(handle), pattern(4, 5000))
        self.assertEqual(ctypes.string_at(handle.ptr(), 5000), pattern(4, 5000))
        self.assertEqual(memoryview(handle).nbytes, 5000)
        found = store.batch_get_buffer(["h", "nope"])
        self.assertEqual(bytes(found[0]), pattern(4, 5000))
        self.assertIsNone(found[1])
        self.assertEqual(store.batch_get_buffer([]), [])

    def test_misses_and_bad_arguments_return_codes_not_exceptions(self):
        store = self.store()
        self.assertEqual(store.get("absent"), b"")
        self.assertIsNone(store.get_buffer("absent"))
        self.assertEqual(store.get_size("absent"), NOT_FOUND)
        self.assertEqual(store.is_exist("absent"), 0)
        self.assertEqual(store.remove("absent"), NOT_FOUND)
        self.assertEqual(store.batch_is_exist([]), [])
        self.assertEqual(store.put("", b"v"), INVALID_PARAMS)
        self.assertEqual(store.put("k" * 5000, b"v"), INVALID_PARAMS)
        self.assertEqual(store.put("empty", b""), INVALID_PARAMS)
        self.assertEqual(store.put_batch(["a", "b"], [b"1"]), INVALID_PARAMS)
        self.assertEqual(store.remove_by_regex("(unclosed"), INVALID_PARAMS)
        with self.assertRaises(TypeError):
            store.put(7, b"v")  # a wrong argument type raises, as the binding does

    def test_removal_respects_read_leases_unless_forced(self):
        store = self.store()
        for i in range(5):
            self.assertEqual(store.put("rm-%d" % i, b"v"), 0)
        store.get("rm-0")  # a read lease (10 s) now protects rm-0
        self.assertEqual(store.remove("rm-0"), HAS_LEASE)
        self.assertEqual(store.remove("rm-0", force=True), 0)
        self.assertEqual(store.batch_remove(["rm-1", "rm-1x"]), [0, NOT_FOUND])
        self.assertEqual(store.remove_by_regex("^rm-[23]$"), 2)
        self.assertEqual(store.batch_is_exist(["rm-2", "rm-3", "rm-4"]), [0, 0, 1])
        self.assertEqual(store.remove_all(force=True), 1)
        self.assertEqual(store.is_exist("rm-4"), 0)

    def test_threads_share_one_store(self):
        import threading
        store = self.store()
        errors = []

        def worker(t):
            for i in range(20):
                key, value = "t%d-%d" % (t, i), pattern(t * 100 + i, 20_000)
                if store.put(key, value) != 0 or store.get(key) != value:
                    errors.append(key)
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.assertEqual(errors, [])


class PointerApiTest(AgentTestCase):
    def test_registered_buffer_round_trip_with_batch_put_from_and_batch_get_into(self):
        store = self.store()
        pages, page = 64, 64 << 10
        source = Memory(pages * page, b"".join(pattern(p, page) for p in range(pages)))
        target = Memory(pages * page)
        self.assertEqual(store.register_buffer(source.address, source.size), 0)
        self.assertEqual(store.register_buffer(target.address, target.size), 0)
        keys = ["page-%d" % p for p in range(pages)]
        ptrs = [source.address + p * page for p in range(pages)]
        self.assertEqual(store.batch_put_from(keys, ptrs, [page] * pages), [0] * pages)
        got = store.batch_get_into(keys, [target.address + p * page for p in range(pages)],
                                   [page] * pages)
        self.assertEqual(got, [page] * pages)
        self.assertEqual(target.read(0, target.size), source.read(0, source.size))
        self.assertEqual(store.unregister_buffer(source.address), 0)
        self.assertEqual(store.unregister_buffer(source.address), INVALID_PARAMS)

    def test_single_key_pointer_calls_and_a_buffer_too_small(self):
        store = self.store()
        data = pattern(9, 24_000)
        mem = Memory(len(data) + 1024, data)
        self.assertEqual(store.put_from("zc", mem.address, len(data)), 0)
        self.assertEqual(store.get("zc"), data)
        ctypes.memset(mem.address, 0, mem.size)
        self.assertEqual(store.get_into("zc", mem.address, mem.size), len(data))
        self.assertEqual(mem.read(0, len(data)), data)
        small = Memory(len(data) // 2)
        self.assertEqual(store.get_into("zc", small.address, small.size), INVALID_PARAMS)
        self.assertEqual(store.get_into("zc-missing", mem.address, mem.size), NOT_FOUND)
        self.assertEqual(store.put_from("zero", mem.address, 0), 0)  # nothing stored
        self.assertEqual(store.is_exist("zero"), 0)
        self.assertEqual(store.upsert_from("zc2", mem.address, 10), 0)
        self.assertEqual(store.upsert_from("zc2", mem.address + 1, 20), 0)
        self.assertEqual(store.get_size("zc2"), 20)
        self.assertEqual(store.get("zc2"), data[1:21])

    def test_multi_buffer_calls_gather_and_scatter_each_key(self):
        store = self.store()
        layers, chunk = 4, 3000
        src = Memory(2 * layers * chunk, pattern(5, 2 * layers * chunk))
        keys = ["mb-0", "mb-1"]
        ptrs = [[src.address + (k * layers + l) * chunk for l in range(layers)] for k in (0, 1)]
        sizes = [[chunk] * layers for _ in keys]
        self.assertEqual(store.batch_put_from_multi_buffers(keys, ptrs, sizes), [0, 0])
        self.assertEqual(store.get("mb-1"), src.read(layers * chunk, layers * chunk))
        dst = Memory(2 * layers * chunk)
        # Scattered in the other order: each key's layers land in reverse.
        dptrs = [[dst.address + (k * layers + (layers - 1 - l)) * chunk for l in range(layers)]
                 for k in (0, 1)]
        self.assertEqual(store.batch_get_into_multi_buffers(keys, dptrs, sizes),
                         [layers * chunk] * 2)
        for k in (0, 1):
            for l in range(layers):
                self.assertEqual(dst.read((k * layers + layers - 1 - l) * chunk, chunk),
                                 src.read((k * layers + l) * chunk, chunk))
        self.assertEqual(store.batch_get_into_multi_buffers(["mb-0"], [dptrs[0][:1]],
                                                            [[chunk]]), [INVALID_PARAMS])

    def test_mismatched_list_lengths_fail_every_key_and_store_nothing(self):
        store = self.store()
        mem = Memory(4096, pattern(6, 4096))
        keys = ["mm-0", "mm-1"]
        self.assertEqual(store.batch_put_from(keys, [mem.address] * 3, [10] * 3),
                         [INVALID_PARAMS] * 2)
        self.assertEqual(store.batch_get_into(keys, [mem.address], [10, 10]),
                         [INVALID_PARAMS] * 2)
        self.assertEqual(store.batch_put_from_multi_buffers(keys, [[mem.address]], [[1], [1]]),
                         [INVALID_PARAMS] * 2)
        self.assertEqual(store.batch_put_from_multi_buffers(keys, [[mem.address]] * 2,
                                                            [[1, 2], [1]]),
                         [INVALID_PARAMS] * 2)
        self.assertEqual(store.batch_is_exist(keys), [0, 0])
        self.assertEqual(store.batch_put_from([], [], []), [])
        self.assertEqual(store.batch_get_into([], [], []), [])

    def test_a_bad_pointer_fails_only_its_key_and_the_agent_carries_on(self):
        if os.environ.get("KVAGENT_MOONCAKE_PROCESS_MEMORY") == "0":
            self.skipTest("without process memory the copy happens in this process")
        store = self.store()
        good = Memory(4096, pattern(13, 4096))
        unmapped = 4096  # the first pages of an address space are never mapped
        self.assertEqual(store.batch_put_from(["ok", "bad"], [good.address, unmapped],
                                              [4096, 4096]), [0, INVALID_PARAMS])
        self.assertEqual(store.batch_is_exist(["ok", "bad"]), [1, 0])
        self.assertEqual(store.batch_get_into(["ok", "ok"], [good.address, unmapped],
                                              [4096, 4096]), [4096, INVALID_PARAMS])
        self.assertEqual(store.get_into("ok", unmapped, 4096), INVALID_PARAMS)
        self.assertEqual(store.put_from("bad-2", unmapped, 100), INVALID_PARAMS)
        self.assertEqual(store.get("ok"), pattern(13, 4096))  # the agent is still serving
        self.assertEqual(store.health_check(), 0)

    def test_a_batch_larger_than_the_arena_is_stored_whole(self):
        store = self.store()
        count, size = 80, 1 << 20  # 80 MiB through a 64 MiB arena
        mem = Memory(count * size)
        for i in range(count):
            ctypes.memset(mem.address + i * size, i + 1, size)
        keys = ["big-%d" % i for i in range(count)]
        ptrs = [mem.address + i * size for i in range(count)]
        self.assertEqual(store.batch_put_from(keys, ptrs, [size] * count), [0] * count)
        ctypes.memset(mem.address, 0, mem.size)
        self.assertEqual(store.batch_get_into(keys, ptrs, [size] * count), [size] * count)
        for i in (0, 37, count - 1):
            self.assertEqual(mem.read(i * size, size), bytes([i + 1]) * size)

    def test_ranged_reads_land_in_registered_buffers_only(self):
        store = self.store()
        data = {"r-1": pattern(11, 64), "r-2": pattern(12, 64)}
        for k, v in data.items():
            self.assertEqual(store.put(k, v), 0)
        address = store.alloc_from_mem_pool(64)
        self.assertNotEqual(address, 0)
        self.assertEqual(store.register_buffer(address, 64), 0)
        ctypes.memset(address, 0, 64)
        got = store.get_into_ranges(
            [address], [["r-1", "r-2", "r-missing"]], [[[0, 10], [20], [40]]],
            [[[1, 30], [2], [0]]], [[[4, 3], [5], [4]]])
        self.assertEqual(got, [[[4, 3], [5], [NOT_FOUND]]])
        self.assertEqual(ctypes.string_at(address, 4), data["r-1"][1:5])
        self.assertEqual(ctypes.string_at(address + 10, 3), data["r-1"][30:33])
        self.assertEqual(ctypes.string_at(address + 20, 5), data["r-2"][2:7])
        # Outside the value, outside the registered buffer, or lists that do not line up.
        self.assertEqual(store.get_into_ranges([address], [["r-1"]], [[[0, 62]]], [[[62, 0]]],
                                               [[[4, 4]]]), [[[INVALID_PARAMS] * 2]])
        self.assertEqual(store.get_into_ranges([address], [["r-1", "r-2"]], [[[0], []]],
                                               [[[0, 1], []]], [[[], []]]),
                         [[[INVALID_PARAMS], []]])
        unregistered = Memory(64)
        self.assertEqual(store.get_into_ranges([unregistered.address], [["r-1"]], [[[0]]],
                                               [[[0]]], [[[4]]]), [[[INVALID_PARAMS]]])
        # Offsets and sizes are unsigned, as in Mooncake's binding: a negative one is a TypeError
        # and copies nothing (memmove would have written before the buffer, read outside the
        # value, or taken -1 for a size of 2^64 - 1).
        ctypes.memset(address, 0, 64)
        for dst, src, n in ((-16, 0, 8), (0, -32, 8), (0, 0, -1)):
            with self.assertRaises(TypeError):
                store.get_into_ranges([address], [["r-1"]], [[[dst]]], [[[src]]], [[[n]]])
        self.assertEqual(ctypes.string_at(address, 64), bytes(64))

    def test_host_allocator_memory_is_kvagent_shared_memory(self):
        store = self.store()
        allocator = MooncakeHostMemAllocator()
        address = allocator.alloc(1 << 20)
        self.assertNotEqual(address, 0)
        # The pool is a kvagent client segment's arena (a memfd the agent passed over
        # agent.sock), so its pages are where the agent copies values from and to.
        mapping = []
        with open("/proc/self/maps") as maps:
            for line in maps:
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                if start <= address < end:
                    mapping.append(line)
        self.assertEqual(len(mapping), 1)
        self.assertIn("/memfd:kvagent-client-", mapping[0])
        ctypes.memmove(address, pattern(8, 1 << 20), 1 << 20)
        self.assertEqual(store.put_from("host-mem", address, 1 << 20), 0)
        self.assertEqual(store.get("host-mem"), pattern(8, 1 << 20))
        self.assertEqual(allocator.free(address), 0)
        self.assertEqual(allocator.free(address), -1)


class SessionIdTest(AgentTestCase):
    pool = "256MiB"

    def test_every_write_path_puts_each_keys_session_on_its_stored_event(self):
        store = self.store()
        mem = Memory(1 << 16, pattern(7, 1 << 16))
        expect = {}

        def config(sessions):
            c = ReplicateConfig()
            c.session_ids = sessions
            return c
        keys = ["pf-%d" % i for i in range(4)]
        sessions = ["engine-A", "sessão-β", "会话-7", "run-🚀"]
        self.assertEqual(store.batch_put_from(keys, [mem.address] * 4, [100] * 4,
                                              config(sessions)), [0] * 4)
        expect.update(zip(keys, sessions))
        self.assertEqual(store.put("one", b"v", config(["é" * 128])), 0)  # 256 bytes: the limit
        expect["one"] = "é" * 128
        self.assertEqual(store.put_batch(["pb-0", "pb-1"], [b"a", b"b"],
                                         config(["s-0", None])), 0)
        expect.update({"pb-0": "s-0", "pb-1": None})
        self.assertEqual(store.batch_put_from_multi_buffers(
            ["mb-0", "mb-1"], [[mem.address, mem.address + 10]] * 2, [[5, 5]] * 2,
            config(["多-0", "多-1"])), [0, 0])
        expect.update({"mb-0": "多-0", "mb-1": "多-1"})
        self.assertEqual(store.put("untagged", b"v"), 0)
        expect["untagged"] = None
        # SGLang's group expansion: one logical page -> _k and _v keys, each with its session.
        logical = ["page-a", "page-b"]
        phys = [f"{k}_0_{s}" for k in logical for s in ("k", "v")]
        c = config(["sess-a", "sess-a", "sess-b", "sess-b"])
        c.group_ids = ["g-a", "g-a", "g-b", "g-b"]
        self.assertEqual(store.batch_put_from(phys, [mem.address] * 4, [64] * 4, copy.copy(c)),
                         [0] * 4)
        expect.update(zip(phys, c.session_ids))
        self.assertTrue(wait_until(lambda: set(self.agent.stored_sessions()) >= set(expect)))
        self.assertEqual({k: v for k, v in self.agent.stored_sessions().items() if k in expect},
                         expect)

    def test_sessions_stay_with_their_keys_when_a_batch_is_sent_in_parts(self):
        store = self.store()
        count, size = 80, 1 << 20  # more than one arena's worth: several sends
        mem = Memory(count * size)
        keys = ["part-%d" % i for i in range(count)]
        sessions = ["s-%d-ü" % i for i in range(count)]
        c = ReplicateConfig()
        c.session_ids = sessions
        self.assertEqual(store.batch_put_from(keys, [mem.address + i * size for i in range(count)],
                                              [size] * count, c), [0] * count)
        self.assertTrue(wait_until(lambda: len(self.agent.stored_sessions()) >= count))
        self.assertEqual(self.agent.stored_sessions(), dict(zip(keys, sessions)))

    def test_invalid_session_ids_refuse_the_whole_call_and_store_nothing(self):
        store = self.store()
        mem = Memory(4096, pattern(3, 4096))
        keys = ["bad-0", "bad-1"]
        for sessions in (["ok", "x" * 257], ["ok", b"\xff\xfe"], ["only one"],
                         ["ok", "é" * 129]):
            c = ReplicateConfig()
            c.session_ids = sessions
            self.assertEqual(store.batch_put_from(keys, [mem.address] * 2, [16] * 2, c),
                             [INVALID_PARAMS] * 2, sessions)
            self.assertEqual(store.put_batch(keys, [b"1", b"2"], c), INVALID_PARAMS)
            self.assertEqual(store.batch_put_from_multi_buffers(keys, [[mem.address]] * 2,
                                                                [[8]] * 2, c),
                             [INVALID_PARAMS] * 2)
        self.assertEqual(store.batch_is_exist(keys), [0, 0])
        self.assertEqual(store.put("good", b"v"), 0)  # the stream has moved on since
        self.assertTrue(wait_until(lambda: "good" in self.agent.stored_sessions()))
        self.assertEqual(set(self.agent.stored_sessions()), {"good"})


WRITER = r"""
import ctypes, sys
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
store = MooncakeDistributedStore()
assert store.setup("writer", "P2PHANDSHAKE", 1 << 26, 1 << 24, "tcp", "", "127.0.0.1:50051") == 0
n, size = int(sys.argv[1]), int(sys.argv[2])
buf = (ctypes.c_ubyte * (n * size))()
for i in range(n):
    ctypes.memset(ctypes.addressof(buf) + i * size, 0x30 + i, size)
c = ReplicateConfig()
c.session_ids = ["writer-%d" % i for i in range(n)]
codes = store.batch_put_from(["x-%d" % i for i in range(n)],
                             [ctypes.addressof(buf) + i * size for i in range(n)], [size] * n, c)
sys.exit(0 if codes == [0] * n else 1)
"""


class FailureTest(AgentTestCase):
    def test_a_second_process_reads_what_the_first_wrote(self):
        n, size = 8, 100_000
        writer = subprocess.run([sys.executable, "-c", WRITER, str(n), str(size)],
                                env=dict(os.environ), timeout=60)
        self.assertEqual(writer.returncode, 0)
        store = self.store()
        mem = Memory(n * size)
        got = store.batch_get_into(["x-%d" % i for i in range(n)],
                                   [mem.address + i * size for i in range(n)], [size] * n)
        self.assertEqual(got, [size] * n)
        for i in range(n):
            self.assertEqual(mem.read(i * size, size), bytes([0x30 + i]) * size)

    def test_a_stopped_agent_gives_negative_codes_and_a_restarted_one_is_used_again(self):
        store = self.store()
        mem = Memory(4096, pattern(1, 4096))
        self.assertEqual(store.put("before", b"v"), 0)
        self.agent.kill()
        self.assertEqual(store.put("k", b"v"), RPC_FAIL)
        self.assertEqual(store.batch_put_from(["a", "b"], [mem.address] * 2, [8, 8]),
                         [RPC_FAIL] * 2)
        self.assertEqual(store.batch_get_into(["a"], [mem.address], [4096]), [RPC_FAIL])
        self.assertEqual(store.get("before"), b"")
        self.assertIsNone(store.get_buffer("before"))
        self.assertLess(store.is_exist("before"), 0)
        self.assertEqual(store.batch_is_exist(["a", "b"]), [RPC_FAIL] * 2)
        self.assertEqual(store.remove("before"), RPC_FAIL)
        self.assertLess(store.remove_all(), 0)
        self.assertLess(store.get_size("before"), 0)
        self.assertEqual(store.health_check(), 2)
        self.agent.start()  # a new agent (empty pool) in the same run directory
        self.assertTrue(wait_until(lambda: store.put("after", b"again") == 0))
        self.assertEqual(store.get("after"), b"again")
        self.assertEqual(store.health_check(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
