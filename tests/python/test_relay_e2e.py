#!/usr/bin/python3
"""The agent's event relay end to end: a real kvmaster, a real EventRelay (relay_driver), and
strict consumers (python-msgpack raw=False, strict_map_key=True) on the relay's sockets.

The relay follows the master's PUB through a link this test controls (a SUB->PUB forwarder
that can be cut), and the master's replay ROUTER directly, as an agent whose network to the
master hiccups would. Checked: the relay's stream decodes strictly with every writer's session
(non-ASCII and 256-byte ones included), its seq is contiguous from 0, live and replay carry
the same bytes on ipc and tcp, and at every quiet point an index fed only by the relay's
stream equals the master's key set (ListKeys) — after a short cut (repaired through replay),
after a cut the master's replay ring cannot cover (AllBlocksCleared + re-announce), and after
a master restart.

Environment: KVMASTER, MASTER_TEST_CLIENT, RELAY_DRIVER (paths to the binaries).
"""
import os
import signal
import subprocess
import tempfile
import threading
import time
import unittest

import zmq

import strict_events as se
from test_strict_events import LineProcess

TIMEOUT_S = 30
# Writers' sessions: ASCII, accented, CJK, emoji, exactly 256 bytes of 2-byte characters.
SESSIONS = ["sess-1", "sessão-β", "会话-7", "run-🚀", "é" * 128]


def wait_for(predicate, what, timeout_s=TIMEOUT_S):
    """Polls predicate() until true; fails after timeout_s (a bound, not an assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Link(threading.Thread):
    """Forwards the master's live messages to its own PUB; while cut, drops them."""

    def __init__(self, ctx, master_events):
        super().__init__(daemon=True)
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(master_events)
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.cut = False
        self.dropped = 0
        self.forwarded = 0
        self.stopping = threading.Event()

    def run(self):
        try:
            while not self.stopping.is_set():
                if not self.sub.poll(20, zmq.POLLIN):
                    continue
                frames = self.sub.recv_multipart()
                if self.cut:
                    self.dropped += 1
                else:
                    self.pub.send_multipart(frames)
                    self.forwarded += 1
        finally:
            self.sub.close(0)
            self.pub.close(0)

    def stop(self):
        self.stopping.set()
        self.join(TIMEOUT_S)


class RelayEndToEnd(unittest.TestCase):
    replay_batches = 10000  # the master's replay ring
    relay_args = []  # more relay_driver flags

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="kvagent-relay-py-")
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name
        self.run_dir = os.path.join(self.dir, "run")
        os.mkdir(self.run_dir)
        # All ipc: a restarted master comes back on the same endpoints.
        self.rpc = f"ipc://{self.dir}/master-rpc.sock"
        self.master_events = f"ipc://{self.dir}/master-events.sock"
        self.master_replay = f"ipc://{self.dir}/master-replay.sock"
        self.master = None
        self.start_master()
        self.addCleanup(self.stop_master)
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, 0)
        self.link = Link(self.ctx, self.master_events)
        self.link.start()
        self.addCleanup(self.link.stop)
        self.relay = LineProcess([os.environ["RELAY_DRIVER"], "--master-rpc", self.rpc,
                              "--master-events", self.link.endpoint,
                              "--master-events-replay", self.master_replay,
                              "--run-dir", self.run_dir, "--events-tcp", "tcp://127.0.0.1:0",
                              "--page-limit", "16", *self.relay_args])
        self.addCleanup(self.relay.kill)
        self.events, self.replay_ep, self.events_tcp = self.relay.expect("READY")[:3]
        self.assertEqual(self.events, f"ipc://{self.run_dir}/events.sock")

    # ---- the master -----------------------------------------------------------------------

    def start_master(self):
        ready = os.path.join(self.dir, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        self.master = subprocess.Popen(
            [os.environ["KVMASTER"], "--listen", self.rpc, "--events", self.master_events,
             "--events-replay", self.master_replay, "--ready-file", ready,
             "--events-replay-batches", str(self.replay_batches),
             "--state-dir", os.path.join(self.dir, "state"), "--agent-ttl-ms", "600000"],
            stderr=subprocess.DEVNULL)
        def up():
            if self.master.poll() is not None or not os.path.exists(ready):
                return self.master.poll() is not None
            with open(ready) as f:
                return "replay=" in f.read()
        wait_for(up, "kvmaster's ready file")
        self.assertIsNone(self.master.poll(), "kvmaster exited")

    def stop_master(self):
        if self.master.poll() is None:
            self.master.send_signal(signal.SIGTERM)
            try:
                self.assertEqual(self.master.wait(timeout=TIMEOUT_S), 0)
            except subprocess.TimeoutExpired:
                self.master.kill()
                self.master.wait()
                raise

    def drive(self, *args):
        subprocess.run([os.environ["MASTER_TEST_CLIENT"], self.rpc, *args], check=True,
                       timeout=TIMEOUT_S)

    def master_next_seq(self):
        history = se.replay(self.master_replay, 0, context=self.ctx)
        return history[-1].seq + 1 if history else 0

    def master_keys(self):
        """The master's key set (ListKeys through the driver): key -> session ('' untagged)."""
        self.relay.send("keys")
        keys = {}
        while True:
            line = self.relay.readline(TIMEOUT_S)
            if line[0] == "END":
                return keys
            self.assertEqual(line[0], "KEY", line)
            unhex = lambda h: "" if h == "-" else bytes.fromhex(h).decode("utf-8")
            keys[unhex(line[1])] = unhex(line[2])

    # ---- the relay ------------------------------------------------------------------------

    def stats(self):
        self.relay.send("stats")
        return dict(kv.split("=", 1) for kv in self.relay.expect("STATS"))

    def settle(self):
        """A quiet point: the relay is live, has taken every master batch and sent it on.
        Returns the relay's whole stream from seq 0 (replayed, strictly decoded)."""
        def caught_up():
            s = self.stats()
            return s["phase"] == "live" and s["master_next_seq"] == str(self.master_next_seq())
        wait_for(caught_up, "the relay to catch up with the master")
        self.relay.send("flush")
        flushed = int(self.relay.expect("FLUSHED")[0])
        history = se.replay(self.replay_ep, 0, context=self.ctx)
        se.check_contiguous([m.seq for m in history], start=0)
        self.assertEqual(history[-1].seq, flushed - 1)
        for m in history:
            se.assert_canonical(m.payload)
        return history

    @staticmethod
    def index_of(history):
        """What a KV-aware router builds from the stream alone: object_key -> session."""
        index = {}
        for m in history:
            for ev in m.batch.events:
                if ev["type"] == "AllBlocksCleared":
                    index.clear()
                elif ev["type"] == "BlockStored":
                    index[ev["object_key"]] = ev.get("session_id", "")
                else:
                    index.pop(ev["object_key"], None)
        return index

    @staticmethod
    def cleared(history):
        return sum(ev["type"] == "AllBlocksCleared" for m in history for ev in m.batch.events)

    def assert_converged(self):
        history = self.settle()
        self.assertEqual(self.index_of(history), self.master_keys())
        return history

    def join_link(self):
        """Moves the master's stream on until the link forwards (its SUB has joined)."""
        n = 0
        while self.link.forwarded == 0:
            n += 1
            self.assertLess(n, 500, "the link never joined the master's PUB")
            self.drive("put", f"warm-{n}=")
            time.sleep(0.02)


class RelayStream(RelayEndToEnd):
    def test_relayed_stream_decodes_strictly_with_each_writers_session(self):
        history = self.assert_converged()
        self.assertEqual(history[0].batch.events[0], {"type": "AllBlocksCleared"})
        with se.Subscriber(self.events, context=self.ctx) as ipc, \
                se.Subscriber(self.events_tcp, context=self.ctx) as tcp:
            self.join_link()
            time.sleep(0.2)  # lets the subscriptions reach the relay (not an assertion)
            self.drive("put", *[f"key-{i}={s}" for i, s in enumerate(SESSIONS)],
                       "0x00000000000000ff=sess-1", "untagged=")
            self.drive("remove", "key-0")
            history = self.assert_converged()
            last = history[-1].seq
            index = self.index_of(history)
            for i, s in enumerate(SESSIONS[1:], start=1):
                self.assertEqual(index[f"key-{i}"], s)
            self.assertNotIn("key-0", index)
            self.assertEqual(index["untagged"], "")
            stored = [ev for m in history for ev in m.batch.events if ev["type"] == "BlockStored"]
            self.assertIn([255], [ev["block_hashes"] for ev in stored])
            by_seq = {m.seq: m.payload for m in history}
            for sub in (ipc, tcp):
                live = sub.collect_until(last)  # decoded strictly, 3 frames each
                self.assertTrue(live)
                for m in live:
                    self.assertEqual(m.payload, by_seq[m.seq], "live and replay differ")
        s = self.stats()
        self.assertEqual((s["unrepaired"], s["resets"], s["reannounces"]), ("0", "0", "1"))

    def test_gap_is_repaired_after_the_master_link_is_cut_briefly(self):
        self.join_link()
        self.assert_converged()
        self.link.cut = True
        for i in range(8):
            self.drive("put", f"during-cut-{i}={SESSIONS[i % len(SESSIONS)]}")
        self.drive("remove", "during-cut-3")
        wait_for(lambda: self.link.dropped >= 9, "the link to drop the batches")
        self.link.cut = False
        self.drive("put", "after-cut=sess-1")
        history = self.assert_converged()
        self.assertIn("during-cut-7", self.index_of(history))
        s = self.stats()
        self.assertGreaterEqual(int(s["repaired"]), 1)
        self.assertEqual(s["unrepaired"], "0")
        self.assertEqual(s["reannounces"], "1")
        self.assertEqual(self.cleared(history), 1)


class RelayUnrepairableGap(RelayEndToEnd):
    replay_batches = 2
    # The gap must be found by the batch after the cut, when the master keeps only 2 of the 7.
    # An idle probe between two slow drives (a loaded machine, ThreadSanitizer) would instead
    # fetch each dropped batch while the master still keeps it, and nothing would be lost.
    relay_args = ["--idle-probe-ms", "600000"]

    def test_a_cut_the_master_cannot_replay_ends_in_a_reannounce_that_converges(self):
        self.drive("put", *[f"old-{i}={SESSIONS[i % len(SESSIONS)]}" for i in range(12)])
        self.join_link()
        self.assert_converged()
        before = self.stats()
        self.link.cut = True
        self.drive("remove", "old-1", "old-2")
        self.drive("put", "lost-a=会话-7", "lost-b=")
        self.drive("removeall")
        self.drive("put", "after-clear-1=run-🚀", "after-clear-2=" + "é" * 128)
        self.drive("remove", "after-clear-1")
        self.drive("put", "lost-c=sess-1")
        wait_for(lambda: self.link.dropped >= 6, "the link to drop the batches")
        self.link.cut = False
        self.drive("put", "seen=sessão-β")
        history = self.assert_converged()
        index = self.index_of(history)
        self.assertNotIn("old-3", index)  # gone with the RemoveAll the relay never saw live
        self.assertEqual(index["after-clear-2"], "é" * 128)
        s = self.stats()
        self.assertGreater(int(s["unrepaired"]), int(before["unrepaired"]))
        self.assertGreater(int(s["reannounces"]), int(before["reannounces"]))
        # The re-announce publishes the differences: what the relay missed arrives as one
        # BlockRemoved per object, and nothing clears the consumers' index again.
        self.assertEqual(self.cleared(history), 1)
        removed = {ev.get("object_key") for m in history for ev in m.batch.events
                   if ev["type"] == "BlockRemoved"}
        for key in ("old-0", "old-1", "old-3", "old-11"):
            self.assertIn(key, removed)


class RelayMasterRestart(RelayEndToEnd):
    def test_a_master_restart_is_followed_by_a_reannounce_of_the_differences(self):
        self.join_link()
        for i in range(30):  # a first life longer than the second one's start
            self.drive("put", f"first-{i}={SESSIONS[i % len(SESSIONS)]}")
        self.assert_converged()
        self.stop_master()
        self.start_master()  # same endpoints and state dir: its log restores the objects
        # The relay may hear the new run's opening batch itself (its link rejoined in time) or
        # only a later one: either way the second life stores at least one key.
        n = 0
        while True:
            n += 1
            self.drive("put", f"second-{n}=sessão-β")
            if self.stats()["resets"] != "0":
                break
            self.assertLess(n, 300, "the relay never saw the master restart")
            time.sleep(0.02)
        history = self.assert_converged()
        index = self.index_of(history)
        self.assertIn("second-1", index)
        self.assertGreaterEqual(int(self.stats()["reannounces"]), 2)
        self.assertEqual(self.cleared(history), 1)  # the restored objects were known already
        self.assertEqual(self.relay.stop(), 0)
        self.assertFalse(os.path.exists(os.path.join(self.run_dir, "events.sock")))
        self.assertFalse(os.path.exists(os.path.join(self.run_dir, "events-replay.sock")))


if __name__ == "__main__":
    unittest.main()
