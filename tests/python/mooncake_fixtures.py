"""What the Mooncake-compatibility tests share: a real kvagent in a fresh run directory, a
MooncakeDistributedStore set up the way engines do it, and the agent's event history decoded
strictly (strict_events.py).

Environment: KVAGENT_BINARY (the kvagent executable), KVAGENT_LIBKVCLIENT (libkvclient.so),
PYTHONPATH with sdk/python/compat, sdk/python and tests/python.
"""
import ctypes
import os
import signal
import subprocess
import tempfile
import time
import unittest

import strict_events as se
from mooncake.store import MooncakeDistributedStore
from test_sdk_python import wait_until  # polls until true, within a bound

def _die_with_parent():
    """In the child before exec: SIGKILL when the test process exits (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)


class Agent:
    """A standalone kvagent (embedded master) in ``run_dir``; started at once."""

    def __init__(self, run_dir, pool="128MiB"):
        self.run_dir = run_dir
        self.pool = pool
        self.proc = None
        self.start()

    def start(self):
        log = None if os.environ.get("KVAGENT_TEST_AGENT_LOG") else subprocess.DEVNULL
        # The agent dies with this process, even if it crashes (no orphan holds CTest's pipes).
        self.proc = subprocess.Popen([os.environ["KVAGENT_BINARY"], "--run-dir", self.run_dir,
                                      "--pool-size", self.pool], stdout=subprocess.DEVNULL,
                                     stderr=log, preexec_fn=_die_with_parent)
        socket = os.path.join(self.run_dir, "agent.sock")
        wait_until(lambda: os.path.exists(socket) or self.proc.poll() is not None)
        if self.proc.poll() is not None or not os.path.exists(socket):
            raise RuntimeError("kvagent did not start in %s" % self.run_dir)

    def kill(self):
        """SIGKILL and reap (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    @property
    def replay_endpoint(self):
        return "ipc://" + os.path.join(self.run_dir, "events-replay.sock")

    def history(self):
        """Every event batch the agent published, replayed from seq 0 and decoded strictly."""
        return se.replay(self.replay_endpoint, 0)

    def stored_sessions(self):
        """{object_key: session_id or None} of every BlockStored in the history (the last one
        per key wins), after checking the stream is contiguous and canonical."""
        history = self.history()
        se.check_contiguous([m.seq for m in history], start=0)
        out = {}
        for m in history:
            se.assert_canonical(m.payload)
            for ev in m.batch.events:
                if ev["type"] == "BlockStored":
                    out[ev["object_key"]] = ev.get("session_id")
        return out


def setup_args(local_buffer_size=16 << 20):
    """The seven positional arguments SGLang's MooncakeStore passes to setup()."""
    return ("localhost", "P2PHANDSHAKE", 64 << 20, local_buffer_size, "tcp", "",
            "127.0.0.1:50051")


class AgentTestCase(unittest.TestCase):
    """A fresh run directory and kvagent per test; KVAGENT_RUN_DIR points at it."""

    pool = "128MiB"

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="kvagent-mooncake-")
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        self.run_dir = os.path.join(tmp.name, "run")
        self.agent = Agent(self.run_dir, self.pool)
        self.addCleanup(self.agent.kill)
        previous = os.environ.get("KVAGENT_RUN_DIR")
        os.environ["KVAGENT_RUN_DIR"] = self.run_dir
        self.addCleanup(self._restore_env, previous)

    @staticmethod
    def _restore_env(previous):
        if previous is None:
            os.environ.pop("KVAGENT_RUN_DIR", None)
        else:
            os.environ["KVAGENT_RUN_DIR"] = previous

    def store(self, **kw):
        """A MooncakeDistributedStore set up like SGLang does (closed at cleanup)."""
        store = MooncakeDistributedStore()
        self.assertEqual(store.setup(*setup_args(**kw)), 0)
        self.addCleanup(store.close)
        return store
