"""The strict decoder itself (it must reject what strict consumers reject), then a real
EventPublisher (event_publisher_driver) checked with it: strict decoding, canonical bytes,
contiguous seq from 0, replay layout, non-ASCII session IDs.

Run by CTest: KVAGENT_EVENT_DRIVER names the driver binary.
"""

import os
import select
import subprocess
import time
import unittest

import msgpack

import strict_events as se

GOLDEN_HEX = (
    "93cb41d9d27d280000009389a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573917b"
    "b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a"
    "6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa73657373696f6e5f6964"
    "a6736573732d3183a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573917ba66d65"
    "6469756da347505581a474797065b0416c6c426c6f636b73436c656172656400")

# Mirrors ScriptedSessions() in event_publisher_driver.cc.
SCRIPTED_SESSIONS = ["sess-1", "sessão-β", "会话-7", "run-🚀", "é" * 128]


def stored(**over):
    ev = {"type": "BlockStored", "block_hashes": [123], "parent_block_hash": None,
          "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None, "medium": "GPU",
          "lora_name": None, "session_id": "sess-1"}
    ev.update(over)
    return {k: v for k, v in ev.items() if v is not ...}


def removed(**over):
    ev = {"type": "BlockRemoved", "block_hashes": [123], "medium": "GPU"}
    ev.update(over)
    return ev


def pack(events, batch=None):
    return msgpack.packb(batch if batch is not None else [1732900000.0, events, 0],
                         use_bin_type=True)


class StrictDecoderTest(unittest.TestCase):
    def assertRejected(self, payload, *words):
        with self.assertRaises(se.StrictEventError) as cm:
            se.decode_payload(payload)
        for w in words:
            self.assertIn(w, str(cm.exception))

    def test_golden_bytes_of_events_md_decode_and_are_canonical(self):
        payload = bytes.fromhex(GOLDEN_HEX)
        self.assertEqual(pack([stored(), removed(), {"type": "AllBlocksCleared"}]), payload)
        batch = se.decode_payload(payload)
        self.assertEqual(batch.ts, 1732900000.0)
        self.assertEqual(batch.events[0]["session_id"], "sess-1")
        se.assert_canonical(payload)

    def test_two_element_batch_is_rejected(self):
        self.assertRejected(pack(None, [1.0, []]), "exactly 3")

    def test_integer_ts_is_rejected_because_we_always_write_float64(self):
        self.assertRejected(pack(None, [1732900000, [], 0]), "ts", "float64")

    def test_unknown_type_and_legacy_array_events_are_rejected(self):
        self.assertRejected(pack([{"type": "BlockMoved"}]), "unknown type")
        self.assertRejected(pack([["BlockRemoved", [1], "GPU"]]), "legacy array")

    def test_nil_token_ids_and_bin_hash_are_rejected(self):
        self.assertRejected(pack([stored(token_ids=None)]), "token_ids")
        self.assertRejected(pack([stored(block_hashes=[b"\x01" * 8])]), "block_hashes[0]", "int")

    def test_invalid_utf8_anywhere_is_rejected(self):
        bad = pack([stored(session_id="X")]).replace(b"\xa1X", b"\xa1\xff")
        self.assertRejected(bad, "UnicodeDecodeError")

    def test_non_string_map_key_and_duplicate_keys_are_rejected(self):
        self.assertRejected(pack([{"type": "AllBlocksCleared", 1: 2}]), "map key")
        cleared = msgpack.packb("type") + msgpack.packb("AllBlocksCleared")
        dup = b"\x93" + msgpack.packb(1.0) + b"\x91\x82" + cleared + cleared + b"\x00"
        self.assertRejected(dup, "duplicate")

    def test_token_count_must_be_block_size_times_hashes(self):
        self.assertRejected(pack([stored(token_ids=[1, 2, 3])]), "3 tokens")
        se.decode_payload(pack([stored(token_ids=[])]))  # [] = unknown: fine

    def test_token_ids_are_u32_and_hashes_fit_64_bits(self):
        self.assertRejected(pack([stored(token_ids=[1, 2, 3, 2**32])]), "u32")
        self.assertRejected(pack([stored(block_hashes=[1.5])]), "block_hashes[0]", "int")
        self.assertRejected(pack([stored(parent_block_hash=True)]), "parent_block_hash", "int")
        se.decode_payload(pack([stored(block_hashes=[2**64 - 1], parent_block_hash=-2**63)]))

    def test_session_rules(self):
        self.assertRejected(pack([removed(session_id="s")]), "only on BlockStored")
        self.assertRejected(pack([stored(session_id="")]), "empty")
        self.assertRejected(pack([stored(session_id=None)]), "nil")
        self.assertRejected(pack([stored(session_id="é" * 129)]), "256 bytes")
        se.decode_payload(pack([stored(session_id="é" * 128)]))
        se.decode_payload(pack([stored(session_id=...)]))  # untagged: key omitted

    def test_medium_must_be_uppercase_and_required_keys_present(self):
        self.assertRejected(pack([removed(medium="cpu")]), "uppercase")
        ev = stored()
        del ev["lora_id"]
        self.assertRejected(pack([ev]), "lora_id")

    def test_key_order_and_unknown_keys_are_checked_for_our_stream(self):
        ev = stored()
        reordered = {"block_hashes": ev.pop("block_hashes"), **ev}
        self.assertRejected(pack([reordered]), "order")
        self.assertRejected(pack([removed(locality="LOCAL")]), "order")
        se.decode_payload(pack([removed(locality="LOCAL")]), strict_keys=False)

    def test_non_canonical_encoding_is_detected(self):
        wide = b"\x93" + msgpack.packb(1.0) + b"\x90\xd3" + (0).to_bytes(8, "big")
        se.decode_payload(wide)  # decodes: dp_rank 0 written as int64
        with self.assertRaises(se.StrictEventError):
            se.assert_canonical(wide)

    def test_frame_checks(self):
        with self.assertRaises(se.StrictEventError):
            se.parse_live_frames([b"", b"\x00" * 8])
        with self.assertRaises(se.StrictEventError):
            se.parse_live_frames([b"", b"\x00" * 7, bytes.fromhex(GOLDEN_HEX)])
        self.assertEqual(se.parse_live_frames([b"t", (5).to_bytes(8, "big"),
                                               bytes.fromhex(GOLDEN_HEX)]).seq, 5)
        with self.assertRaises(se.StrictEventError):
            se.check_contiguous([0, 1, 3])
        with self.assertRaises(se.StrictEventError):
            se.check_contiguous([1, 2], start=0)


class LineProcess:
    """A child process that answers commands on stdin with lines on stdout; killed and reaped
    by kill() whatever happens. Other tests (test_relay_e2e.py) use it too."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     bufsize=0)
        self.pending = b""  # bytes read from stdout, not yet split into lines

    def readline(self, timeout_s=20):
        """The next stdout line, split into words."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise AssertionError(f"{self.proc.args[0]} said nothing for {timeout_s} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"{self.proc.args[0]} exited with {self.proc.wait()}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode("utf-8").split()

    def expect(self, word, timeout_s=20):
        line = self.readline(timeout_s)
        if not line or line[0] != word:
            raise AssertionError(f"{self.proc.args[0]} answered {line!r}, expected {word}")
        return line[1:]

    def send(self, cmd):
        self.proc.stdin.write(cmd.encode() + b"\n")

    def stop(self):
        self.send("stop")
        return self.proc.wait(timeout=20)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


class Driver(LineProcess):
    """event_publisher_driver as a child process."""

    def __init__(self, topic=""):
        super().__init__([os.environ["KVAGENT_EVENT_DRIVER"], "--endpoint", "tcp://127.0.0.1:0",
                          "--replay-endpoint", "tcp://127.0.0.1:*", "--topic", topic])
        try:
            self.endpoint = self.expect("ENDPOINT")[0]
            self.replay_endpoint = self.expect("REPLAY")[0]
        except BaseException:
            self.kill()
            raise

    def command(self, cmd, answer="PUBLISHED"):
        self.send(cmd)
        return [int(x) for x in self.expect(answer)]


class PublisherConformanceTest(unittest.TestCase):
    def setUp(self):
        self.driver = Driver(topic="kv@node-ü")
        self.addCleanup(self.driver.kill)

    def join_live(self, sub):
        """Probes until the SUB sees a batch; returns the next seq to expect live."""
        for _ in range(200):
            next_seq, _ = self.driver.command("probe")
            msg = sub.recv(timeout_ms=50)
            if msg is not None:
                if msg.seq < next_seq - 1:  # later probes are still on their way: take them
                    sub.collect_until(next_seq - 1)
                return next_seq
        self.fail("the SUB never received a batch")

    def test_scripted_events_decode_strictly_with_contiguous_seq_and_full_replay(self):
        with se.Subscriber(self.driver.endpoint) as sub:
            first_live = self.join_live(sub)
            next_seq, events = self.driver.command("publish")
            live = sub.collect_until(next_seq - 1)
        se.check_contiguous([m.seq for m in live], start=first_live)
        self.assertEqual(sum(len(m.batch.events) for m in live), events)
        for m in live:
            self.assertEqual(m.topic, "kv@node-ü".encode())
            se.assert_canonical(m.payload)

        # Replay from 0 has everything, probes included, byte-identical to what went live.
        history = se.replay(self.driver.replay_endpoint, 0, topic="kv@node-ü".encode())
        se.check_contiguous([m.seq for m in history], start=0)
        self.assertEqual(history[-1].seq, next_seq - 1)
        by_seq = {m.seq: m.payload for m in history}
        for m in live:
            self.assertEqual(by_seq[m.seq], m.payload)

        scripted = [ev for m in live for ev in m.batch.events]
        sessions = [ev["session_id"] for ev in scripted[:5]]
        self.assertEqual(sessions, SCRIPTED_SESSIONS)
        by_type = {}
        for ev in scripted:
            by_type.setdefault(ev["type"], []).append(ev)
        self.assertEqual(set(by_type), set(se.KNOWN_TYPES))
        self.assertTrue(all("session_id" not in ev for ev in by_type["BlockRemoved"]))
        self.assertIn(-0x1c4f3bbd6703e3ec, [h for ev in scripted for h in ev.get("block_hashes", [])],
                      "SHA-256 key e3b0c442... gives its first 64 bits as a signed int64")
        self.assertIn(2**64 - 1, [h for ev in scripted for h in ev.get("block_hashes", [])])
        keyed = [ev for ev in scripted if "object_key" in ev]
        self.assertEqual(keyed[0]["object_key"], "model/llama/layer-0/ключ")
        self.assertEqual(keyed[0]["block_hashes"], [])
        self.assertTrue(all(len(m.batch.events) <= 512 for m in live))

    def test_replay_from_the_middle_and_beyond_the_end(self):
        next_seq, _ = self.driver.command("publish")
        middle = next_seq // 2
        history = se.replay(self.driver.replay_endpoint, middle)
        se.check_contiguous([m.seq for m in history], start=middle)
        self.assertEqual(history[-1].seq, next_seq - 1)
        self.assertEqual(se.replay(self.driver.replay_endpoint, next_seq + 10), [])
        stats = self.driver.command("stats", answer="STATS")
        self.assertEqual(stats[3], 2, "two replay requests served")
        self.assertEqual(stats[2], 0, "nothing dropped")
        self.assertEqual(self.driver.stop(), 0)


if __name__ == "__main__":
    unittest.main()
