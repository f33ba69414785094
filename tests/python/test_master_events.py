#!/usr/bin/python3
"""KV events of a real kvmaster, decoded as strict consumers decode them.

Starts kvmaster on ephemeral 127.0.0.1 ports, drives it with master_test_client (puts with
session IDs, a remove, an upsert, RemoveAll), and checks what a Dynamo/vLLM-style subscriber
would see: 3-frame PUB messages with contiguous big-endian seq, payloads that decode with
msgpack raw=False + strict_map_key=True into [ts, events, dp_rank], map-form events with
"type" first, BlockStored with session_id when tagged, BlockRemoved/AllBlocksCleared without,
AllBlocksCleared first; and the replay ROUTER answering [b"", start_seq] with the 4-frame layout
and the end marker.

Decoding and frame checks are those of strict_events.py (the project's docs/events.md oracle).
Environment: KVMASTER (path to kvmaster), MASTER_TEST_CLIENT (path to master_test_client).
"""
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strict_events  # noqa: E402  (the project's conformance oracle for docs/events.md)

TIMEOUT_S = 20


def summary(ev):
    """(type, object_key, session_id, block_hashes) of one event."""
    return (ev["type"], ev.get("object_key"), ev.get("session_id"), ev.get("block_hashes"))


class KvmasterEvents(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kvmaster-py-")
        ready = os.path.join(self.tmp.name, "ready")
        self.proc = subprocess.Popen(
            [os.environ["KVMASTER"], "--listen", "tcp://127.0.0.1:0",
             "--events", "tcp://127.0.0.1:0", "--events-replay", "tcp://127.0.0.1:0",
             "--ready-file", ready],
            stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + TIMEOUT_S
        self.ep = {}
        while time.monotonic() < deadline and "replay" not in self.ep:
            if self.proc.poll() is not None:
                self.fail("kvmaster exited with %s" % self.proc.returncode)
            if os.path.exists(ready):
                with open(ready) as f:
                    self.ep = dict(line.strip().split("=", 1) for line in f if "=" in line)
            time.sleep(0.01)
        self.assertIn("replay", self.ep, "kvmaster did not write its ready file")
        self.ctx = zmq.Context()

    def tearDown(self):
        self.ctx.destroy(linger=0)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.assertEqual(self.proc.wait(timeout=TIMEOUT_S), 0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        self.tmp.cleanup()

    def drive(self, *args):
        subprocess.run([os.environ["MASTER_TEST_CLIENT"], self.ep["rpc"], *args], check=True,
                       timeout=TIMEOUT_S)

    def test_stream_replay_and_strict_decoding(self):
        sub = self.ctx.socket(zmq.SUB)
        self.addCleanup(sub.close, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVTIMEO, TIMEOUT_S * 1000)
        sub.connect(self.ep["events"])
        # A SUB socket misses what is published before its subscription reaches the publisher.
        # Warm up with RemoveAll (one AllBlocksCleared each) until one arrives.
        warmups = 0
        while not sub.poll(200):
            self.assertLess(warmups, 100, "the subscriber never received anything")
            self.drive("removeall")
            warmups += 1
        self.drive("put", "0x00000000000000ff=sess-1", "plain-key=", "tagged-key=sess-2",
                   "1234=",
                   "remove", "plain-key",
                   "upsert", "tagged-key=sess-3",
                   "removeall")
        scenario = [
            ("BlockStored", "0x00000000000000ff", "sess-1", [255]),
            ("BlockStored", "plain-key", None, []),
            ("BlockStored", "tagged-key", "sess-2", []),
            ("BlockStored", "1234", None, [1234]),
            ("BlockRemoved", "plain-key", None, []),
            ("BlockRemoved", "tagged-key", None, []),  # the upsert makes it unreadable
            ("BlockStored", "tagged-key", "sess-3", []),
            ("AllBlocksCleared", None, None, None),
        ]
        cleared = ("AllBlocksCleared", None, None, None)
        # Start-up clear, one clear per warm-up, then the scenario.
        expected = [cleared] * (1 + warmups) + scenario

        # Live: contiguous seq from the first batch received, ending with the scenario.
        live, seqs = [], []
        while live[-len(scenario):] != scenario:
            frames = sub.recv_multipart()
            msg = strict_events.parse_live_frames(frames)  # exactly 3 frames, strict payload
            strict_events.assert_canonical(msg.payload)
            self.assertEqual(msg.topic, b"")
            seqs.append(msg.seq)
            live.extend(summary(e) for e in msg.batch.events)
        strict_events.check_contiguous(seqs)
        self.assertEqual(live, expected[len(expected) - len(live):])

        # Replay from 0: the 4-frame layout, every batch since the start, then the end marker.
        history = strict_events.replay(self.ep["replay"], 0, timeout_ms=TIMEOUT_S * 1000,
                                       context=self.ctx)
        strict_events.check_contiguous([m.seq for m in history], start=0)
        replayed = [summary(e) for m in history for e in m.batch.events]
        self.assertEqual(replayed, expected)
        self.assertEqual(replayed[0][0], "AllBlocksCleared", "a new master clears first")
        self.assertEqual(seqs[-1], history[-1].seq, "live and replay agree on the last seq")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
