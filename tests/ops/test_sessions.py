#!/usr/bin/python3
"""`kvctl sessions` (the SDK's Client::Sessions, the master's per-session counters) against a
real kvmaster and agent, and what a consumer of the agent's event stream derives: the blocks per
session agree, and the bytes are the sizes of those blocks.

Environment: KVAGENT, KVMASTER, KVCTL.
"""
import json
import unittest

from ops_support import Processes


class SessionsTest(unittest.TestCase):
    def setUp(self):
        self.p = Processes("kvagent-sessions-")
        self.addCleanup(self.p.stop)
        master = self.p.kvmaster()
        self.run_dir, _ = self.p.kvagent("a", master=master)

    def kvctl(self, *args):
        r = self.p.kvctl(self.run_dir, *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def from_events(self):
        """key -> session as an event consumer knows it (replayed from seq 0), and key -> size."""
        r = self.p.kvctl(self.run_dir, "events", "tail", "--json", "--from-seq", "0", "--count",
                         "100000", "--timeout-ms", "1500")
        keys = {}
        for line in r.stdout.splitlines():
            e = json.loads(line)
            if "notice" in e:
                continue
            if e["type"] == "AllBlocksCleared":
                keys.clear()
            elif e["type"] == "BlockStored":
                keys[e["object_key"]] = e.get("session_id", "")
            elif e["type"] == "BlockRemoved":
                keys.pop(e["object_key"], None)
        sizes = {}
        for line in self.kvctl("ls").splitlines():
            key, size, _ = line.split("\t")
            sizes[key] = int(size)
        usage = {}
        for key, session in keys.items():
            if session:
                blocks, size = usage.get(session, (0, 0))
                usage[session] = (blocks + 1, size + sizes[key])
        return usage

    def queried(self, *extra):
        out = {}
        for line in self.kvctl("sessions", "--json", *extra).splitlines():
            u = json.loads(line)
            out[u["session_id"]] = (u["blocks"], u["bytes"])
        return out

    def test_sessions_agree_with_an_event_consumer(self):
        for i in range(5):
            self.kvctl("put", f"s1/{i}", "--value", "x" * (100 + i), "--session", "s1")
        for i in range(3):
            self.kvctl("put", f"s2/{i}", "--value", "y" * 1000, "--session", "s2")
        self.kvctl("put", "untagged", "--value", "z")
        self.kvctl("put", "会话/0", "--value", "w" * 7, "--session", "会话")
        self.kvctl("rm", "s1/0", "--force")
        self.kvctl("rm", "s2/1", "--force")
        expected = {"s1": (4, 101 + 102 + 103 + 104), "s2": (2, 2000), "会话": (1, 7)}
        self.assertEqual(self.from_events(), expected)
        self.assertEqual(self.queried(), expected)
        # One session; one that stores nothing; the largest first with --top.
        self.assertEqual(self.kvctl("sessions", "--session", "s2"), "s2\t2\t2000\n")
        self.assertEqual(self.kvctl("sessions", "--session", "nobody"), "nobody\t0\t0\n")
        self.assertEqual(self.kvctl("sessions", "--top", "2"), "s2\t2\t2000\ns1\t4\t410\n")
        # A bad session ID is refused by the shared boundary, naming the rule.
        r = self.p.kvctl(self.run_dir, "sessions", "--session", "s" * 300)
        self.assertEqual(r.returncode, 1)
        self.assertIn("INVALID_PARAMS", r.stderr)


if __name__ == "__main__":
    unittest.main()
