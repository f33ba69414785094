#!/usr/bin/python3
"""Process memory with values that live in, or go to, another agent's pool: two kvagents of one
kvmaster, clients granted process memory on each. A put's part bound for a peer is staged in
the writer's peer scratch (a range of its arena) and written over the data plane; a get of a
value held only by the peer lands in the reader's peer scratch and then in its memory. A
scratch too small for a part fails that key with NO_SPACE, and nothing of it becomes readable.

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


if __name__ == "__main__":
    unittest.main(verbosity=2)
