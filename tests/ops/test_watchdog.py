#!/usr/bin/python3
"""systemd's notifications from the real binaries, with a notification socket standing in for
systemd's: READY=1 once serving, WATCHDOG=1 pings with STATUS= lines from the working thread when
$WATCHDOG_USEC asks for them, STOPPING=1 on SIGTERM.

Environment: KVAGENT, KVMASTER, KVCTL.
"""
import os
import signal
import socket
import unittest

from ops_support import LIMIT_S, Processes


class NotifySocket:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(LIMIT_S)
        self.path = path

    def next(self):
        return self.sock.recv(4096).decode()

    def next_matching(self, prefix):
        """The next notification starting with prefix (others are skipped, bounded)."""
        for _ in range(1000):
            m = self.next()
            if m.startswith(prefix):
                return m
        raise AssertionError(f"no notification starting with {prefix!r}")


class WatchdogTest(unittest.TestCase):
    def setUp(self):
        self.p = Processes("kvagent-watchdog-")
        self.addCleanup(self.p.stop)
        self.notify = NotifySocket(os.path.join(self.p.dir, "notify"))
        self.addCleanup(self.notify.sock.close)
        # As systemd sets them for WatchdogSec=200ms (pings every 100 ms).
        self.env = dict(os.environ, NOTIFY_SOCKET=self.notify.path, WATCHDOG_USEC="200000")

    def test_kvagent(self):
        run_dir, proc = self.p.kvagent("a", env=self.env)
        self.assertTrue(self.notify.next_matching("READY=1").startswith(
            "READY=1\nSTATUS=kvagent ready: standalone"))
        self.assertEqual(self.p.kvctl(run_dir, "put", "k", "--value", "v").returncode, 0)
        ping = self.notify.next_matching("WATCHDOG=1")
        self.assertTrue(ping.startswith("WATCHDOG=1\nSTATUS=kvagent serving "), ping)
        # Pings sent before the put may still be queued: the status shows it in a later one.
        self.notify.next_matching("WATCHDOG=1\nSTATUS=kvagent serving 0 client(s); requests so "
                                  "far: 1 put")
        proc.send_signal(signal.SIGTERM)
        self.notify.next_matching("STOPPING=1")
        self.assertEqual(proc.wait(LIMIT_S), 0)

    def test_kvmaster(self):
        ready = os.path.join(self.p.dir, "ready")
        proc = self.p.start([os.environ["KVMASTER"], "--listen", "tcp://127.0.0.1:0", "--events",
                             "tcp://127.0.0.1:0", "--events-replay", "tcp://127.0.0.1:0",
                             "--ready-file", ready], "kvmaster.log", env=self.env)
        self.assertTrue(self.notify.next_matching("READY=1").startswith(
            "READY=1\nSTATUS=kvmaster serving: requests on tcp://127.0.0.1:"))
        ping = self.notify.next_matching("WATCHDOG=1")
        self.assertTrue(ping.startswith("WATCHDOG=1\nSTATUS=kvmaster serving 0 agent(s), 0 key"),
                        ping)
        proc.send_signal(signal.SIGTERM)
        self.notify.next_matching("STOPPING=1")
        self.assertEqual(proc.wait(LIMIT_S), 0)

    def test_no_pings_without_a_watchdog(self):
        env = dict(self.env)
        del env["WATCHDOG_USEC"]
        _, proc = self.p.kvagent("a", env=env)
        self.notify.next_matching("READY=1")
        self.notify.sock.settimeout(0.5)
        with self.assertRaises(socket.timeout):
            self.notify.next()
        proc.kill()


if __name__ == "__main__":
    unittest.main()
