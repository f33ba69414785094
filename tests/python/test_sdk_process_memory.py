#!/usr/bin/python3
"""The Python SDK's put_from/get_into against a real kvagent, with process memory granted (the
agent copies straight between this process and its pool) and without (the library goes through
the arena): the same results, byte for byte; memory the agent cannot use fails only its key;
a caller built with the 0.1 kv_connect_options_t (smaller struct_size) still connects.

Environment: KVAGENT_BINARY, KVAGENT_LIBKVCLIENT, PYTHONPATH including sdk/python.
"""
import ctypes
import unittest

import kvagent
from kvagent import _native
from test_sdk_python import SdkTest


def pattern(seed, size):
    return bytes((seed * 29 + i * 7 + (i >> 10)) & 0xFF for i in range(size))


class Memory:
    """A ctypes buffer of this process with its address."""

    def __init__(self, data=b"", size=None):
        self.array = (ctypes.c_ubyte * (size if size is not None else len(data)))()
        self.address = ctypes.addressof(self.array)
        if data:
            ctypes.memmove(self.address, data, len(data))

    def read(self, offset, size):
        return ctypes.string_at(self.address + offset, size)


class ProcessMemoryTest(SdkTest):
    def both(self):
        """A client granted process memory and one that is not, each with a 1 MiB arena."""
        granted = self.connect(process_memory=True)
        staged = self.connect()
        self.assertTrue(granted.process_memory)
        self.assertFalse(staged.process_memory)
        return granted, staged

    def test_values_round_trip_byte_exact_with_and_without_process_memory(self):
        for c in self.both():
            tag = "pm" if c.process_memory else "arena"
            one = Memory(pattern(1, 70000))
            parts = [Memory(pattern(2, 3)), Memory(pattern(3, 300001))]
            r = c.put_from(["%s-one" % tag, "%s-parts" % tag],
                           [(one.address, 70000),
                            [(parts[0].address, 3), (parts[1].address, 300001)]],
                           session_ids=["s", "s"])
            self.assertTrue(r.ok, r.keys)
            whole = pattern(2, 3) + pattern(3, 300001)
            out_one = Memory(size=80000)
            out_parts = [Memory(size=100000), Memory(size=1), Memory(size=250000)]
            r = c.get_into(["%s-one" % tag, "%s-parts" % tag],
                           [(out_one.address, 80000),
                            [(m.address, len(m.array)) for m in out_parts]])
            self.assertEqual([k.code for k in r.keys], [kvagent.ErrorCode.OK] * 2)
            self.assertEqual([k.length for k in r.keys], [70000, len(whole)])
            self.assertEqual(out_one.read(0, 70000), pattern(1, 70000))
            got = b"".join(m.read(0, len(m.array)) for m in out_parts)[:len(whole)]
            self.assertEqual(got, whole)

    def test_a_submitted_puts_bytes_are_copied_before_submit_returns(self):
        """The C ABI's promise for raw values of kv_submit_*: the caller may change or drop its
        bytes once the call is submitted. With the agent stopped the put runs only after they
        changed: it must store what they were at submit, with and without process memory,
        for a bytearray, a view of the client's own arena, and a temporary bytes object."""
        for c in self.both():
            tag = "pm" if c.process_memory else "arena"
            mutable = bytearray(b"A" * 4096)
            arena = c.allocate(8192)
            view = arena.view()
            view[:] = b"C" * 8192
            self.assertTrue(self.agent.freeze())
            pending = c.submit_put(["%s-mutable" % tag, "%s-view" % tag, "%s-temporary" % tag],
                                   [mutable, view, bytes([0x5A]) * 20000])
            mutable[:] = b"B" * 4096
            view[:] = b"D" * 8192
            junk = [bytes([0x11]) * 20000 for _ in range(64)]  # takes the freed heap
            self.agent.thaw()
            r = pending.wait()
            self.assertTrue(r.ok, r.keys)
            del junk
            self.assertEqual(c.get_bytes("%s-mutable" % tag), b"A" * 4096)
            self.assertEqual(c.get_bytes("%s-view" % tag), b"C" * 8192)
            self.assertEqual(c.get_bytes("%s-temporary" % tag), bytes([0x5A]) * 20000)
            del view
            arena.close()

    def test_a_value_larger_than_the_arena_needs_process_memory(self):
        granted, staged = self.both()
        big = Memory(pattern(4, 4 << 20))  # 4 MiB through a 1 MiB arena
        self.assertEqual(granted.put_from(["big"], [(big.address, 4 << 20)]).keys[0].code,
                         kvagent.ErrorCode.OK)
        back = Memory(size=4 << 20)
        r = granted.get_into(["big"], [(back.address, 4 << 20)])
        self.assertEqual((r.keys[0].code, r.keys[0].length), (kvagent.ErrorCode.OK, 4 << 20))
        self.assertEqual(back.read(0, 4 << 20), pattern(4, 4 << 20))
        with self.assertRaises(kvagent.NoSpace):
            staged.put_from(["big-2"], [(big.address, 4 << 20)])

    def test_memory_the_agent_cannot_use_fails_only_its_key(self):
        c = self.connect(process_memory=True)
        good = Memory(pattern(5, 1000))
        unmapped = 4096  # the first pages of an address space are never mapped
        r = c.put_from(["good", "nowhere"], [(good.address, 1000), (unmapped, 64)])
        self.assertEqual([k.code for k in r.keys],
                         [kvagent.ErrorCode.OK, kvagent.ErrorCode.INVALID_PARAMS])
        self.assertIn("not readable", r.keys[1].message)
        back = Memory(size=1000)
        r = c.get_into(["good", "good"], [(back.address, 1000), (unmapped, 4096)])
        self.assertEqual([k.code for k in r.keys],
                         [kvagent.ErrorCode.OK, kvagent.ErrorCode.INVALID_PARAMS])
        self.assertEqual(back.read(0, 1000), pattern(5, 1000))
        self.assertEqual([k.exists for k in c.exist(["good", "nowhere"]).keys], [True, False])
        self.assertIsNone(c.ping())  # the agent is still there

    def test_mismatched_arguments_are_refused_locally(self):
        c = self.connect(process_memory=True)
        with self.assertRaises(kvagent.InvalidParams):
            c.put_from(["a", "b"], [(1, 1)])
        with self.assertRaises(kvagent.InvalidParams):
            c.put_from(["a"], [("not an address", 1)])
        with self.assertRaises(kvagent.InvalidParams):
            c.get_into(["a"], [[]])

    def test_a_caller_built_with_the_first_options_struct_still_connects(self):
        lib = _native.library()
        first = ctypes.sizeof(_native.ConnectOptions) - 16  # 0.1 ended before process_memory
        self.assertEqual(_native.ConnectOptions.process_memory.offset, first)
        options = _native.ConnectOptions(struct_size=first,
                                         run_dir=self.agent.run_dir.encode(),
                                         process_memory=1)  # beyond struct_size: not read
        handle = ctypes.c_void_p()
        self.assertEqual(lib.kv_connect(ctypes.byref(options), ctypes.byref(handle)), 0,
                         lib.kv_last_error_message())
        self.assertEqual(lib.kv_client_process_memory(handle), 0)
        lib.kv_client_free(handle)
        options.struct_size = first - 8
        self.assertEqual(lib.kv_connect(ctypes.byref(options), ctypes.byref(handle)),
                         kvagent.ErrorCode.INVALID_PARAMS)


if __name__ == "__main__":
    unittest.main(verbosity=2)
