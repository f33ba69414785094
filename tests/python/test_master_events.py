#!/usr/bin/python3
"""KV events of a real kvmaster, decoded as strict consumers decode them.

Starts kvmaster on ephemeral 127.0.0.1 ports, drives it with master_test_client (puts with
session IDs, a remove, an upsert, RemoveAll), and checks what a Dynamo/vLLM-style subscriber
would see: 3-frame PUB messages with contiguous big-endian seq, payloads that decode with
msgpack raw=False + strict_map_key=True into [ts, events, dp_rank], map-form events with
"type" first, BlockStored with session_id when tagged, BlockRemoved/AllBlocksCleared without,
AllBlocksCleared first; and the replay ROUTER answering [b"", start_seq] with the 4-frame layout
and the end marker.

Environment: KVMASTER (path to kvmaster), MASTER_TEST_CLIENT (path to master_test_client).
"""
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import msgpack
import zmq

END_SEQ = b"\xff" * 8
TIMEOUT_S = 20


def strict_decode(payload):
    """Decodes one payload the way Dynamo/msgspec do; raises AssertionError on any deviation."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, dp_rank = batch
    assert isinstance(ts, float), ts
    assert dp_rank is None or isinstance(dp_rank, int), dp_rank
    assert isinstance(events, list)
    for ev in events:
        assert isinstance(ev, dict), ev
        keys = list(ev.keys())
        assert keys[0] == "type", keys
        kind = ev["type"]
        if kind == "BlockStored":
            for k in ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                      "medium", "lora_name"):
                assert k in ev, (k, ev)
            assert isinstance(ev["token_ids"], list), ev
            assert all(isinstance(t, int) and 0 <= t < 2**32 for t in ev["token_ids"])
            assert isinstance(ev["block_size"], int)
            if ev["token_ids"]:
                assert len(ev["token_ids"]) == ev["block_size"] * len(ev["block_hashes"])
            assert ev["medium"] == "EXTERNAL", ev
            assert "session_id" not in ev or isinstance(ev["session_id"], str)
            allowed = {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                       "lora_id", "medium", "lora_name", "session_id", "object_key", "group_idx"}
        elif kind == "BlockRemoved":
            assert "block_hashes" in ev and ev["medium"] == "EXTERNAL", ev
            allowed = {"type", "block_hashes", "medium", "object_key"}
        elif kind == "AllBlocksCleared":
            allowed = {"type"}
        else:
            raise AssertionError("unknown event type %r" % kind)
        assert set(ev) <= allowed, (kind, set(ev) - allowed)
        for h in ev.get("block_hashes", []):
            assert isinstance(h, int) and -2**63 <= h < 2**64, h
    return events


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
        time.sleep(0.3)  # let the subscription reach the publisher (not an assertion)

        self.drive("put", "0x00000000000000ff=sess-1", "plain-key=", "tagged-key=sess-2",
                   "1234=",
                   "remove", "plain-key",
                   "upsert", "tagged-key=sess-3",
                   "removeall")
        expected = [
            ("AllBlocksCleared", None, None, None),
            ("BlockStored", "0x00000000000000ff", "sess-1", [255]),
            ("BlockStored", "plain-key", None, []),
            ("BlockStored", "tagged-key", "sess-2", []),
            ("BlockStored", "1234", None, [1234]),
            ("BlockRemoved", "plain-key", None, []),
            ("BlockRemoved", "tagged-key", None, []),  # the upsert makes it unreadable
            ("BlockStored", "tagged-key", "sess-3", []),
            ("AllBlocksCleared", None, None, None),
        ]

        # Live: everything after our subscription joined, contiguous seq, ending in the clear.
        live, seqs = [], []
        while not live or live[-1] != expected[-1] or len(live) < 2:
            frames = sub.recv_multipart()
            self.assertEqual(len(frames), 3, "PUB messages are exactly [topic, seq, payload]")
            self.assertEqual(frames[0], b"")
            self.assertEqual(len(frames[1]), 8)
            seqs.append(int.from_bytes(frames[1], "big"))
            live.extend(summary(e) for e in strict_decode(frames[2]))
        self.assertEqual(seqs, list(range(seqs[0], seqs[0] + len(seqs))), "contiguous seq")
        self.assertEqual(live, expected[len(expected) - len(live):])

        # Replay from 0: the 4-frame layout, every batch since the start, then the end marker.
        dealer = self.ctx.socket(zmq.DEALER)
        self.addCleanup(dealer.close, 0)
        dealer.setsockopt(zmq.RCVTIMEO, TIMEOUT_S * 1000)
        dealer.connect(self.ep["replay"])
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed, rseqs = [], []
        while True:
            frames = dealer.recv_multipart()
            self.assertEqual(len(frames), 4, frames)
            self.assertEqual(frames[0], b"")
            if frames[2] == END_SEQ:
                self.assertEqual(frames[1:], [b"", END_SEQ, b""])
                break
            self.assertEqual(frames[1], b"")
            rseqs.append(int.from_bytes(frames[2], "big"))
            replayed.extend(summary(e) for e in strict_decode(frames[3]))
        self.assertEqual(rseqs, list(range(len(rseqs))), "replay starts at seq 0, contiguous")
        self.assertEqual(replayed, expected)
        self.assertEqual(replayed[0][0], "AllBlocksCleared", "a new master clears first")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
