#!/usr/bin/python3
"""The Python SDK (package ``kvagent``, ctypes over libkvclient.so) against a real kvagent.

Every test starts its own kvagent with a fresh temporary --run-dir and always stops it
(SIGKILL + wait, registered as a cleanup before anything can fail).
Environment: KVAGENT_BINARY (the kvagent executable), KVAGENT_LIBKVCLIENT (libkvclient.so),
PYTHONPATH including sdk/python.
"""
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import kvagent

WAIT_LIMIT_S = 20  # bounds waits for asynchronous effects; nothing asserts on time taken


def wait_until(condition, limit=WAIT_LIMIT_S):
    """Polls ``condition`` every millisecond until it holds or ``limit`` passes."""
    end = time.monotonic() + limit
    while not condition():
        if time.monotonic() >= end:
            return condition()
        time.sleep(0.001)
    return True


def process_state(pid):
    """The state letter of /proc/<pid>/stat ("T" when stopped), or "" when gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


class Agent:
    """A kvagent process in a fresh run directory."""

    def __init__(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="kvagent-py-sdk-")
        self.run_dir = os.path.join(self._tmp.name, "run")
        log = None if os.environ.get("KVAGENT_TEST_AGENT_LOG") else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [os.environ["KVAGENT_BINARY"], "--run-dir", self.run_dir], stderr=log)
        socket = os.path.join(self.run_dir, "agent.sock")
        wait_until(lambda: os.path.exists(socket) or self.proc.poll() is not None)
        self.started = self.proc.poll() is None and os.path.exists(socket)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._tmp.cleanup()

    def freeze(self):
        """SIGSTOP: from now on nothing is answered until thaw()."""
        self.proc.send_signal(signal.SIGSTOP)
        return wait_until(lambda: process_state(self.proc.pid) == "T")

    def thaw(self):
        self.proc.send_signal(signal.SIGCONT)


class SdkTest(unittest.TestCase):
    def setUp(self):
        self.agent = Agent()
        self.addCleanup(self.agent.stop)
        self.assertTrue(self.agent.started, "kvagent did not start")

    def connect(self, arena_bytes=1 << 20, **kw):
        client = kvagent.Client(run_dir=self.agent.run_dir, name="py-sdk-test",
                                arena_bytes=arena_bytes, **kw)
        self.addCleanup(client.close)
        return client

    def can_allocate(self, client, size):
        try:
            client.allocate(size).close()
            return True
        except kvagent.NoSpace:
            return False


class ConnectionTest(SdkTest):
    def test_ping_answers_and_the_client_reports_what_the_agent_granted(self):
        c = self.connect(arena_bytes=1 << 20)
        self.assertIsNone(c.ping())
        self.assertGreater(c.client_id, 0)
        self.assertGreater(c.agent_incarnation, 0)
        self.assertEqual(c.agent_epoch, c.agent_incarnation)  # the deprecated name, same value
        self.assertEqual(c.arena_bytes, 1 << 20)
        self.assertTrue(c.connected)
        major, minor, patch = kvagent.library_version().split(".")
        self.assertTrue(major.isdigit() and minor.isdigit() and patch.isdigit())

    def test_connecting_where_no_agent_listens_raises_agent_unavailable(self):
        with self.assertRaises(kvagent.AgentUnavailable) as caught:
            kvagent.Client(run_dir=os.path.join(self.agent.run_dir, "nowhere"))
        self.assertEqual(caught.exception.code, kvagent.ErrorCode.AGENT_UNAVAILABLE)
        self.assertIn("kvagent --run-dir", caught.exception.message)
        self.assertIsInstance(caught.exception, ConnectionError)

    def test_a_closed_client_refuses_calls(self):
        c = self.connect()
        c.close()
        c.close()  # idempotent
        self.assertFalse(c.connected)
        with self.assertRaises(kvagent.InvalidParams):
            c.ping()

    def test_threads_share_one_client(self):
        c = self.connect()
        failures = []

        def pings():
            for i in range(300):
                try:
                    c.ping() if i % 2 else c.submit_ping().wait()
                except kvagent.KvError as e:
                    failures.append(e)

        threads = [threading.Thread(target=pings) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(failures, [])


class ArenaBufferTest(SdkTest):
    def test_a_view_is_writable_in_place(self):
        c = self.connect()
        buf = c.allocate(4096)
        self.assertEqual((buf.size, len(buf)), (4096, 4096))
        buf.view()[:5] = b"hello"
        buf.view()[4095] = 7
        self.assertEqual(buf.tobytes(5), b"hello")
        self.assertEqual(buf.view()[4095], 7)
        self.assertEqual(buf.view().format, "B")

    def test_exhaustion_raises_no_space_and_size_zero_is_invalid(self):
        c = self.connect(arena_bytes=64 << 10)
        held = c.allocate(64 << 10)
        with self.assertRaises(kvagent.NoSpace) as caught:
            c.allocate(1)
        self.assertIn("largest extent", caught.exception.message)
        with self.assertRaises(kvagent.InvalidParams):
            c.allocate(0)
        held.close()
        self.assertTrue(self.can_allocate(c, 64 << 10))

    def test_a_range_returns_to_the_arena_only_once_no_view_is_alive(self):
        c = self.connect(arena_bytes=64 << 10)
        buf = c.allocate(64 << 10)
        view = buf.view()
        buf.close()
        del buf
        gc.collect()
        view[0] = 1  # still mapped and still ours
        self.assertFalse(self.can_allocate(c, 64 << 10))
        view.release()
        del view
        self.assertTrue(self.can_allocate(c, 64 << 10))
        with self.assertRaises(kvagent.InvalidParams):
            closed = c.allocate(16)
            closed.close()
            closed.view()

    def test_a_buffer_dropped_during_a_call_stays_reserved_until_the_call_is_collected(self):
        c = self.connect(arena_bytes=64 << 10)
        buf = c.allocate(64 << 10)
        self.assertTrue(self.agent.freeze())
        pending = c.submit_get(["k"], [buf])
        buf.close()
        del buf
        gc.collect()
        self.assertFalse(self.can_allocate(c, 64 << 10))
        self.agent.thaw()
        try:
            pending.wait()
        except kvagent.KvError:
            pass  # the call's own outcome does not matter here, only that it is over
        self.assertTrue(self.can_allocate(c, 64 << 10))


class LocalValidationTest(SdkTest):
    """Errors found by the library itself: they come back at once, even from a frozen agent."""

    def setUp(self):
        super().setUp()
        self.client = self.connect()
        self.assertTrue(self.agent.freeze())  # anything reaching the agent would time out

    def test_a_257_byte_session_id_is_invalid_params_for_every_key(self):
        with self.assertRaises(kvagent.InvalidParams) as caught:
            self.client.put(["a", "b"], [b"x", b"y"], session_ids=["ok", "s" * 257],
                            timeout=60)
        e = caught.exception
        self.assertIn("257 bytes", e.message)
        self.assertEqual([k.code for k in e.result.keys], [kvagent.ErrorCode.INVALID_PARAMS] * 2)

    def test_invalid_utf8_bytes_pass_through_the_c_abi_and_are_refused_there(self):
        with self.assertRaises(kvagent.InvalidParams) as caught:
            self.client.exist([b"good", b"\xff\xfe"], timeout=60)
        self.assertIn("keys[1]: invalid UTF-8 at byte 0", caught.exception.message)
        # The length delimits the bytes, not a NUL: the bad byte after one is found.
        with self.assertRaises(kvagent.InvalidParams) as caught:
            self.client.put(["k"], [b"v"], session_ids=[b"a\x00\xff"], timeout=60)
        self.assertIn("session_ids[0]: invalid UTF-8 at byte 2", caught.exception.message)

    def test_arguments_that_cannot_be_encoded_or_paired_are_refused(self):
        with self.assertRaises(kvagent.InvalidParams):
            self.client.put(["\ud800"], [b"v"])  # a lone surrogate has no UTF-8 form
        with self.assertRaises(kvagent.InvalidParams):
            self.client.put(["a", "b"], [b"v"])
        with self.assertRaises(kvagent.InvalidParams):
            self.client.put(["a"], [b"v"], blocks=[None, None])
        with self.assertRaises(kvagent.InvalidParams):
            self.client.put(["a"], [b""])  # a value is at least 1 byte
        with self.assertRaises(kvagent.InvalidParams):
            self.client.put(["a"], [b"v"], replica_count=0)
        with self.assertRaises(kvagent.InvalidParams):
            self.client.put(["a"], [b"v"],  # token IDs: none or block_size per hash
                            blocks=[kvagent.Block(hashes=[1], token_ids=[1, 2, 3], block_size=16)])
        with self.assertRaises(kvagent.InvalidParams):  # a block_size without its tokens
            self.client.put(["a"], [b"v"], blocks=[kvagent.Block(hashes=[1], block_size=16)])
        with self.assertRaises(kvagent.InvalidParams):
            self.client.get(["a"], [b"not an arena buffer"])
        with self.assertRaises(kvagent.InvalidParams):
            self.client.list(prefix=b"\xff", timeout=60)

    def test_a_submit_with_bad_arguments_is_collected_like_any_call(self):
        pending = self.client.submit_put(["k"], [b"v"], session_ids=["s" * 300])
        self.assertTrue(pending.ready())
        with self.assertRaises(kvagent.InvalidParams):
            pending.wait()


class AsyncAndFailureTest(SdkTest):
    def test_a_submitted_call_can_be_polled_then_collected_once(self):
        c = self.connect()
        pending = c.submit_ping()
        self.assertTrue(wait_until(pending.ready))
        self.assertIsNone(pending.wait())
        self.assertTrue(pending.ready())
        with self.assertRaises(kvagent.InvalidParams):
            pending.wait()

    def test_an_unanswered_call_times_out(self):
        c = self.connect()
        self.assertTrue(self.agent.freeze())
        with self.assertRaises(kvagent.Timeout) as caught:
            c.ping(timeout=0.02)
        self.assertIsInstance(caught.exception, TimeoutError)
        self.agent.thaw()
        c.ping()

    def test_a_sigkilled_agent_fails_pending_and_later_calls_with_agent_unavailable(self):
        c = self.connect()
        self.assertTrue(self.agent.freeze())
        pending = c.submit_exist(["k"], timeout=60)
        self.agent.proc.kill()
        self.agent.proc.wait()
        with self.assertRaises(kvagent.AgentUnavailable) as caught:
            pending.wait()
        self.assertEqual([k.code for k in caught.exception.result.keys],
                         [kvagent.ErrorCode.AGENT_UNAVAILABLE])
        self.assertTrue(wait_until(lambda: not c.connected))
        with self.assertRaises(kvagent.AgentUnavailable):
            c.ping(timeout=60)


class RoundTripTest(SdkTest):
    """Data through a standalone kvagent (its embedded master and node pool)."""

    def setUp(self):
        super().setUp()
        self.client = self.connect(arena_bytes=4 << 20)

    def test_the_readme_example_round_trips_zero_copy_and_raw_values(self):
        c = self.client
        buf = c.allocate(4096)
        buf.view()[:5] = b"hello"
        r = c.put(["k1", "k2"], [buf, b"raw bytes"], session_ids=["s1", "会话"],
                  blocks=[kvagent.Block(hashes=[1], token_ids=list(range(16)), block_size=16),
                          None])
        self.assertTrue(r.ok)
        self.assertEqual(r.codes, [kvagent.ErrorCode.OK] * 2)
        self.assertEqual([k.code for k in r.keys], [kvagent.ErrorCode.OK] * 2)
        self.assertEqual(c.get_bytes("k1")[:5], b"hello")
        self.assertEqual(len(c.get_bytes("k1")), 4096)
        self.assertEqual(c.get_bytes("k2"), b"raw bytes")
        target = c.allocate(64)
        g = c.get(["k2"], [target])
        self.assertEqual(g.keys[0].length, 9)
        self.assertEqual(target.tobytes(9), b"raw bytes")

    def test_out_of_range_integers_and_non_finite_timeouts_are_refused_before_anything_is_sent(self):
        # ctypes wraps integers silently: replica_count=257 used to store with 1 replica.
        bad_writes = [dict(replica_count=257), dict(replica_count=-1),
                      dict(soft_pin_ttl_ms=1 << 32), dict(soft_pin_ttl_ms=-5),
                      dict(replica_count=1.5), dict(timeout=float("inf")),
                      dict(timeout=float("nan")), dict(timeout="1")]
        for kw in bad_writes:
            with self.assertRaises(kvagent.InvalidParams, msg=repr(kw)) as caught:
                self.client.put(["range-k"], [b"v"], **kw)
            self.assertNotIn("OverflowError", str(caught.exception))
        self.assertEqual(self.client.exist(["range-k"]).keys[0].exists, False)
        for kw in [dict(limit=(1 << 32) + 5), dict(limit=-1), dict(cursor=-1),
                   dict(timeout=float("inf"))]:
            with self.assertRaises(kvagent.InvalidParams, msg=repr(kw)):
                self.client.list(**kw)
        for timeout in (float("inf"), float("-inf"), float("nan")):
            with self.assertRaises(kvagent.InvalidParams):
                self.client.ping(timeout=timeout)
        with self.assertRaises(kvagent.InvalidParams):
            self.client.allocate(-1)
        with self.assertRaises(kvagent.InvalidParams):
            kvagent.Client(run_dir=self.agent.run_dir, connect_timeout=float("nan"))
        with self.assertRaises(kvagent.InvalidParams):
            self.client.put(["range-k"], [b"v"],
                            blocks=[kvagent.Block(hashes=[1], token_ids=[1 << 32], block_size=1)])
        self.client.put(["range-k"], [b"v"], replica_count=255, soft_pin_ttl_ms=(1 << 32) - 1)
        self.assertEqual(self.client.exist(["range-k"]).keys[0].exists, True)

    def test_keys_are_bytes_with_nul_and_non_ascii_and_values_any_buffer(self):
        c = self.client
        key = "ключ\x00键"
        r = c.put([key, b"bytes-key"], [bytearray(b"\x00\x01\x02"), memoryview(b"mv")])
        self.assertTrue(r.ok, r)
        self.assertEqual(c.get_bytes(key), b"\x00\x01\x02")
        self.assertEqual(c.get_bytes(b"bytes-key"), b"mv")
        self.assertEqual([k.exists for k in c.exist(["ключ", key]).keys], [False, True])

    def test_a_second_put_is_object_already_exists_and_still_ok(self):
        c = self.client
        c.put(["k"], [b"first"])
        r = c.put(["k"], [b"second"])
        self.assertEqual(r.keys[0].code, kvagent.ErrorCode.OBJECT_ALREADY_EXISTS)
        self.assertTrue(r.ok)
        self.assertEqual(c.get_bytes("k"), b"first")

    def test_upsert_replaces_a_value_unless_a_read_lease_holds_it(self):
        c = self.client
        c.put(["free", "read"], [b"aaa", b"bbb"])
        c.get_bytes("read")  # grants a read lease (docs/semantics.md: 10 s by default)
        r = c.upsert(["free", "read"], [b"AAAAAA", b"BBBBBB"])
        self.assertEqual(r.codes, [kvagent.ErrorCode.OK, kvagent.ErrorCode.OBJECT_BUSY])
        self.assertIn("retry", r.keys[1].message)
        self.assertEqual(c.get_bytes("free"), b"AAAAAA")
        self.assertEqual(c.get_bytes("read"), b"bbb")

    def test_exist_remove_and_remove_all_see_what_was_stored(self):
        c = self.client
        c.put(["a", "b", "c"], [b"1", b"2", b"3"])
        self.assertEqual([k.exists for k in c.exist(["a", "x", "c"]).keys], [True, False, True])
        r = c.remove(["a", "x"])
        self.assertFalse(r.ok)  # per-key failure: in the result, not raised
        self.assertEqual(r.codes, [kvagent.ErrorCode.OK, kvagent.ErrorCode.OBJECT_NOT_FOUND])
        self.assertTrue(r.keys[1].message)
        with self.assertRaises(kvagent.ObjectNotFound):
            c.get_bytes("a")
        self.assertEqual(c.remove_all().removed_count, 2)
        self.assertEqual([k.exists for k in c.exist(["b", "c"]).keys], [False, False])

    def test_get_bytes_fetches_a_value_larger_than_its_first_buffer(self):
        c = self.client
        big = bytes(range(256)) * 2048  # 512 KiB: above get_bytes' 256 KiB first try
        c.put(["big"], [big])
        self.assertEqual(c.get_bytes("big"), big)
        with self.assertRaises(kvagent.BufferOutOfRange):
            c.get_bytes("big", capacity=1024)

    def test_async_puts_and_gets_round_trip(self):
        c = self.client
        puts = [c.submit_put(["async-%d" % i], [bytes([i]) * (10 + i)]) for i in range(16)]
        self.assertTrue(all(p.wait().ok for p in puts))
        buffers = [c.allocate(64) for _ in range(16)]
        gets = [c.submit_get(["async-%d" % i], [buffers[i]]) for i in range(16)]
        for i, p in enumerate(gets):
            k = p.wait().keys[0]
            self.assertEqual(k.code, kvagent.ErrorCode.OK)
            self.assertEqual(buffers[i].tobytes(k.length), bytes([i]) * (10 + i))

    def test_list_pages_through_the_prefix_once_with_sizes_and_sessions(self):
        c = self.client
        keys = ["p/%d" % i for i in range(25)]
        sessions = ["会话-%d" % i if i % 2 else None for i in range(25)]
        c.put(keys, [b"v" * (10 + i) for i in range(25)], session_ids=sessions)
        c.put(["q/outside"], [b"x"])
        listed = list(c.iter_keys(prefix="p/", limit=10))
        self.assertEqual(sorted(k.key for k in listed), sorted(keys))
        by_key = {k.key: k for k in listed}
        for i, key in enumerate(keys):
            self.assertEqual(by_key[key].size, 10 + i)
            self.assertEqual(by_key[key].session_id, sessions[i] or "")
        page = c.submit_list(prefix="p/", limit=10).wait()
        self.assertIsInstance(page, kvagent.ListPage)
        self.assertNotEqual(page.next_cursor, 0)
        with self.assertRaises(kvagent.InvalidParams):
            c.list(limit=20000)

    def test_stat_counts_our_puts(self):
        c = self.client
        before = c.stat()["agent.keys.put"]
        c.put(["s1", "s2"], [b"1", b"2"])
        counters = c.submit_stat().wait()
        self.assertEqual(counters["agent.keys.put"], before + 2)
        self.assertIsInstance(counters["agent.master_link"], str)
        self.assertTrue(any(name.startswith("master.") for name in counters))


class LibraryLookupTest(unittest.TestCase):
    """Where the package finds libkvclient (a fresh interpreter each: the library is cached)."""

    def run_python(self, code, **env):
        full = dict(os.environ, **env)
        return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                              text=True, timeout=WAIT_LIMIT_S)

    def test_the_environment_variable_wins_and_a_wrong_path_says_what_to_set(self):
        missing = "/nonexistent/libkvclient.so.0"
        r = self.run_python("import kvagent; kvagent.Client()", KVAGENT_LIBKVCLIENT=missing)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(missing, r.stderr)
        self.assertIn("KVAGENT_LIBKVCLIENT", r.stderr)

    def test_import_works_without_the_library_and_a_copy_next_to_the_package_is_found(self):
        r = self.run_python("import kvagent; print(kvagent.ErrorCode.NO_SPACE.name)",
                            KVAGENT_LIBKVCLIENT="/nonexistent")
        self.assertEqual(r.stdout.strip(), "NO_SPACE", r.stderr)
        with tempfile.TemporaryDirectory(prefix="kvagent-py-lookup-") as tmp:
            package = os.path.join(tmp, "kvagent")
            shutil.copytree(os.path.dirname(kvagent.__file__), package)
            shutil.copy(os.environ["KVAGENT_LIBKVCLIENT"],
                        os.path.join(package, "libkvclient.so.0"))
            env = {k: v for k, v in os.environ.items() if k != "KVAGENT_LIBKVCLIENT"}
            env["PYTHONPATH"] = tmp
            r = subprocess.run([sys.executable, "-c", "import kvagent; print(kvagent.__file__, "
                                "kvagent.library_version())"], env=env, capture_output=True,
                               text=True, timeout=WAIT_LIMIT_S)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(package), r.stdout)


class ErrorCodeTest(unittest.TestCase):
    def test_codes_are_named_and_numbered_as_semantics_md_and_the_wire(self):
        names = ["OK", "INVALID_PARAMS", "OBJECT_NOT_FOUND", "OBJECT_ALREADY_EXISTS",
                 "REPLICA_NOT_READY", "OBJECT_BUSY", "OBJECT_HAS_LEASE", "NO_SPACE",
                 "BUFFER_OUT_OF_RANGE", "TRANSFER_FAILED", "TIMEOUT", "AGENT_UNAVAILABLE",
                 "MASTER_UNAVAILABLE", "INTERNAL", "DATA_CORRUPTED"]
        self.assertEqual([c.name for c in kvagent.ErrorCode], names)
        self.assertEqual([int(c) for c in kvagent.ErrorCode], list(range(len(names))))
        self.assertIs(kvagent.ErrorCode(99), kvagent.ErrorCode.INTERNAL)

    def test_every_error_code_has_its_exception_class(self):
        from kvagent.errors import error_for
        for code in kvagent.ErrorCode:
            if code == kvagent.ErrorCode.OK:
                continue
            e = error_for(code, "what to do")
            self.assertIsInstance(e, kvagent.KvError)
            self.assertIsNot(type(e), kvagent.KvError, code.name)
            self.assertEqual(e.code, code)
            self.assertEqual(str(e), "%s: what to do" % code.name)


if __name__ == "__main__":
    unittest.main()
