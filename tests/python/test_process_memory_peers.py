#!/usr/bin/python3
"""Process memory with values that live in, or go to, another agent's pool: two kvagents of one
kvmaster, clients granted process memory on each. A put's part bound for a peer is staged in
the writer's peer scratch (a range of its arena) and written over the data plane; a get of a
value held only by the peer lands in the reader's peer scratch and then in its memory. A
scratch too small for a part fails that key with NO_SPACE, and nothing of it becomes readable.
Puts through writes the agent reserved ahead at the kvmaster copy from the client's memory
too; a key whose memory cannot be read fails alone and its reserved write goes back.

Environment: KVAGENT, KVMASTER, KVCTL, KVAGENT_LIBKVCLIENT; PYTHONPATH with sdk/python and
tests/python.
"""
import ctypes
import tempfile
import unittest

import kvagent
from test_e2e_events import Kvagent, Kvmaster, wait_for


def pattern(seed, size):
    return bytes((seed * 41 + i * 3 + (i >> 12)) & 0xFF for i in range(size))


class PeersTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="kvagent-pm-peers-")
        self.addCleanup(tmp.cleanup)
        self.master = Kvmaster(tmp.name)
        self.addCleanup(self.master.stop)
        self.agents = []
        for name in ("node-a", "node-b"):
            agent = Kvagent(tmp.name, name, [*self.master.agent_args(),
                                             "--data-listen", "127.0.0.1:0"])
            self.addCleanup(agent.stop)  # before the master's cleanup: agents stop first
            self.agents.append(agent)
        wait_for(lambda: all(a.counters().get("master.agents", 0) == 2 for a in self.agents),
                 "both agents registered")

    def client(self, agent, **kw):
        c = kvagent.Client(run_dir=agent.run_dir, name="pm-peers", arena_bytes=4 << 20,
                           process_memory=True, **kw)
        self.addCleanup(c.close)
        self.assertTrue(c.process_memory)
        return c

    def test_parts_for_and_from_a_peer_go_through_the_peer_scratch(self):
        a, b = self.client(self.agents[0]), self.client(self.agents[1])
        value = pattern(1, 3 << 20)  # 3 MiB from a 4 MiB arena whose scratch is 1 MiB
        src = ctypes.create_string_buffer(value, len(value))
        address = ctypes.addressof(src)
        # Two replicas: one in node-a's pool, one to write to node-b's, which must be staged in
        # the writer's 1 MiB scratch: a 3 MiB part does not fit.
        r = a.put_from(["two-replicas"], [(address, len(value))], replica_count=2)
        self.assertEqual(r.keys[0].code, kvagent.ErrorCode.NO_SPACE, r.keys[0].message)
        self.assertIn("transfers to peers", r.keys[0].message)
        self.assertFalse(a.exist(["two-replicas"]).keys[0].exists)

        small = pattern(2, 256 << 10)
        src_small = ctypes.create_string_buffer(small, len(small))
        r = a.put_from(["small-two"], [(ctypes.addressof(src_small), len(small))],
                       replica_count=2)
        self.assertEqual(r.keys[0].code, kvagent.ErrorCode.OK, r.keys[0].message)
        self.assertGreater(self.agents[0].counters()["agent.bytes_to_peers"], 0)

        # One replica, in node-a's pool: node-b's client reads it from the peer.
        r = a.put_from(["on-a"], [(ctypes.addressof(src_small), len(small))])
        self.assertEqual(r.keys[0].code, kvagent.ErrorCode.OK)
        before = self.agents[1].counters()["agent.bytes_from_peers"]
        out = ctypes.create_string_buffer(len(small))
        r = b.get_into(["on-a", "small-two"], [(ctypes.addressof(out), len(small)),
                                                (ctypes.addressof(out), len(small))])
        self.assertEqual([k.code for k in r.keys], [kvagent.ErrorCode.OK] * 2)
        self.assertEqual(out.raw, small)
        self.assertGreater(self.agents[1].counters()["agent.bytes_from_peers"], before)

        # A value larger than the reader's scratch, held only by the peer: NO_SPACE.
        big_out = ctypes.create_string_buffer(len(value))
        self.assertEqual(a.put_from(["big-on-a"], [(address, len(value))]).keys[0].code,
                         kvagent.ErrorCode.OK)
        r = b.get_into(["big-on-a"], [(ctypes.addressof(big_out), len(value))])
        self.assertEqual(r.keys[0].code, kvagent.ErrorCode.NO_SPACE, r.keys[0].message)
        # With room in its scratch, the same read works and is byte-exact.
        roomy = kvagent.Client(run_dir=self.agents[1].run_dir, arena_bytes=16 << 20,
                               process_memory=True, peer_scratch_bytes=8 << 20)
        self.addCleanup(roomy.close)
        r = roomy.get_into(["big-on-a"], [(ctypes.addressof(big_out), len(value))])
        self.assertEqual(r.keys[0].code, kvagent.ErrorCode.OK, r.keys[0].message)
        self.assertEqual(big_out.raw, value)

    def test_puts_through_reserved_writes_copy_from_memory_and_a_bad_pointer_gives_its_write_back(self):
        # With a kvmaster the agent reserves writes of the sizes it sees; a put whose keys all
        # find one copies from the client's memory at once and commits in one round trip.
        a, agent = self.client(self.agents[0]), self.agents[0]
        size = 64 << 10
        bufs = [ctypes.create_string_buffer(pattern(10 + i, size), size) for i in range(4)]
        ranges = [(ctypes.addressof(b), size) for b in bufs]
        for round_ in range(3):  # the size repeats: the agent asks for writes of it
            r = a.put_from([f"warm-{round_}-{i}" for i in range(4)], ranges)
            self.assertEqual([k.code for k in r.keys], [kvagent.ErrorCode.OK] * 4)
        wait_for(lambda: agent.counters().get("agent.reserved_writes", 0) >= 4,
                 "writes of 64 KiB reserved ahead")
        before = agent.counters()["agent.reserved_puts"]
        unmapped = 4096  # never mapped in a process
        r = a.put_from(["r0", "r1", "bad", "r3"],
                       [ranges[0], ranges[1], (unmapped, size), ranges[3]])
        self.assertEqual([k.code for k in r.keys],
                         [kvagent.ErrorCode.OK, kvagent.ErrorCode.OK,
                          kvagent.ErrorCode.INVALID_PARAMS, kvagent.ErrorCode.OK],
                         [k.message for k in r.keys])
        self.assertEqual(agent.counters()["agent.reserved_puts"], before + 3)
        self.assertEqual([k.exists for k in a.exist(["r0", "r1", "bad", "r3"]).keys],
                         [True, True, False, True])
        out = ctypes.create_string_buffer(size)
        for key, i in (("r0", 0), ("r1", 1), ("r3", 3)):
            r = a.get_into([key], [(ctypes.addressof(out), size)])
            self.assertEqual(r.keys[0].code, kvagent.ErrorCode.OK, r.keys[0].message)
            self.assertEqual(out.raw, pattern(10 + i, size))
        # The bad key's write went back: the key can be put at once, and reads back.
        r = a.put_from(["bad"], [ranges[2]])
        self.assertEqual(r.keys[0].code, kvagent.ErrorCode.OK, r.keys[0].message)
        r = a.get_into(["bad"], [(ctypes.addressof(out), size)])
        self.assertEqual(r.keys[0].code, kvagent.ErrorCode.OK, r.keys[0].message)
        self.assertEqual(out.raw, pattern(12, size))


if __name__ == "__main__":
    unittest.main(verbosity=2)
