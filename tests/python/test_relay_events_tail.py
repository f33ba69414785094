#!/usr/bin/python3
"""`kvctl events tail` as a process (kvctl_events_driver) against a real EventPublisher
(event_publisher_driver and its scripted events, see test_strict_events.py).

Checked: --json lines are valid JSON carrying exactly what a strict decoder (raw=False,
strict_map_key=True) reads from the publisher's replay, non-ASCII and 256-byte sessions
included; readable lines, one per event; --session (non-ASCII) keeps only that session's
BlockStored events; --count and --from-seq; a refused session ID, a bad flag and a silent
endpoint exit non-zero with one line.

Environment: KVCTL_EVENTS (kvctl_events_driver), KVAGENT_EVENT_DRIVER (event_publisher_driver).
"""
import json
import os
import subprocess
import tempfile
import unittest

import strict_events as se
from test_strict_events import SCRIPTED_SESSIONS, Driver

TIMEOUT_S = 60
FIELDS = ("type", "medium", "session_id", "block_hashes", "parent_block_hash", "token_ids",
          "block_size", "lora_name", "object_key")


def tail(*args, run_dir=None):
    argv = [os.environ["KVCTL_EVENTS"]]
    if run_dir:
        argv += ["--run-dir", run_dir]
    argv += ["tail", *args]
    p = subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S)
    return p.returncode, p.stdout.decode("utf-8").splitlines(), p.stderr.decode("utf-8")


class EventsTail(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.driver = Driver()
        cls.next_seq, cls.events = cls.driver.command("publish")
        cls.history = se.replay(cls.driver.replay_endpoint, 0)
        cls.decoded = [(m.seq, ev) for m in cls.history for ev in m.batch.events]

    @classmethod
    def tearDownClass(cls):
        cls.driver.kill()

    def run_tail(self, *args):
        return tail("--endpoint", self.driver.endpoint,
                    "--replay-endpoint", self.driver.replay_endpoint, *args)

    def test_json_lines_carry_exactly_what_a_strict_decoder_reads(self):
        rc, lines, err = self.run_tail("--json", "--from-seq", "0", "--count", str(self.events))
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(lines), self.events)
        printed = [json.loads(line) for line in lines]
        for (seq, ev), out in zip(self.decoded, printed):
            self.assertEqual(out["seq"], seq)
            self.assertIsInstance(out["ts"], float)
            for key in FIELDS:
                if key in ev:
                    self.assertEqual(out[key], ev[key], (seq, key))
                elif key in ("session_id", "object_key"):
                    self.assertNotIn(key, out)
            if ev["type"] == "BlockStored":
                self.assertEqual(out["token_count"], len(ev["token_ids"]))
        self.assertEqual([p["session_id"] for p in printed[:5]], SCRIPTED_SESSIONS)
        hashes = [h for p in printed for h in p.get("block_hashes", [])]
        self.assertIn(-0x1c4f3bbd6703e3ec, hashes)
        self.assertIn(2**64 - 1, hashes)

    def test_readable_lines_one_per_event(self):
        rc, lines, err = self.run_tail("--from-seq", "0", "--count", "5")
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(lines), 5)
        for line, session in zip(lines, SCRIPTED_SESSIONS):
            self.assertTrue(line.startswith("seq=0 BlockStored EXTERNAL session="), line)
            self.assertIn(f"session={session}", line)

    def test_from_seq_and_count(self):
        rc, lines, err = self.run_tail("--from-seq", "3", "--count", "2")
        self.assertEqual(rc, 0, err)
        self.assertEqual(lines[0], "seq=3 AllBlocksCleared")
        self.assertTrue(lines[1].startswith("seq=4 BlockStored"), lines[1])
        self.assertEqual(len(lines), 2)

    def test_session_filter_keeps_only_that_sessions_stored_events(self):
        wanted = [ev for _, ev in self.decoded if ev.get("session_id") == "会话-7"]
        self.assertGreater(len(wanted), 1)
        rc, lines, err = self.run_tail("--json", "--session", "会话-7", "--from-seq", "0",
                                       "--count", str(len(wanted)))
        self.assertEqual(rc, 0, err)
        printed = [json.loads(line) for line in lines]
        self.assertEqual(len(printed), len(wanted))
        self.assertTrue(all(p["type"] == "BlockStored" and p["session_id"] == "会话-7"
                            for p in printed))
        self.assertEqual([p["block_hashes"] for p in printed],
                         [ev["block_hashes"] for ev in wanted])

    def test_a_refused_session_id_exits_non_zero_with_one_line(self):
        for bad in ("x" * 257, b"bad-\xff"):
            rc, lines, err = self.run_tail("--session", bad, "--count", "1")
            self.assertEqual(rc, 2)
            self.assertEqual(lines, [])
            self.assertEqual(len(err.splitlines()), 1, err)
            self.assertIn("refused session ID", err)

    def test_a_bad_flag_exits_two_with_one_line(self):
        rc, lines, err = tail("--no-such-flag")
        self.assertEqual(rc, 2)
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertIn("--no-such-flag", err)

    def test_a_silent_run_dir_with_count_exits_one_naming_the_endpoint(self):
        with tempfile.TemporaryDirectory(prefix="kvctl-tail-") as run_dir:
            rc, lines, err = tail("--count", "1", "--timeout-ms", "300", run_dir=run_dir)
        self.assertEqual(rc, 1)
        self.assertEqual(lines, [])
        # First a note that no agent's socket is there yet, then the timeout.
        self.assertEqual(err, f"kvctl events tail: nothing listens on {run_dir}/events.sock yet "
                              f"(no such socket); waiting for it (is kvagent running with "
                              f"--run-dir {run_dir}?)\n"
                              f"kvctl events tail: no events from ipc://{run_dir}/events.sock "
                              f"within 300 ms (0 of 1 printed)\n")


if __name__ == "__main__":
    unittest.main()
