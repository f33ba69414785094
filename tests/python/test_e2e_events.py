#!/usr/bin/python3
"""KV events of the real kvagent, end to end, as a KV-aware router sees them.

Several writer processes (e2e_client, each an SDK client with a session of its own: ASCII,
accented, CJK, emoji, 256 bytes of two-byte characters, untagged) store keys through kvagent
at the same time; kvctl and another process remove some. A strict consumer (strict_events.py:
python-msgpack raw=False, strict_map_key=True) then reads the agent's stream — replayed from
seq 0 on events-replay.sock, and live on events.sock and --events-tcp — and checks that every
BlockStored names the session of the process that wrote that key (and an untagged key none),
that no BlockRemoved carries a session, that seq is contiguous from 0, and that the index it
builds equals the store's key set as `kvctl ls` prints it.

Standalone: one kvagent with its embedded master. With kvmaster: two kvagents of one kvmaster
process, writers on both; each agent relays the master's stream, so each agent's socket names
the writers of both nodes.

Environment: KVAGENT, KVMASTER, KVCTL, E2E_CLIENT (paths to the binaries).
"""
import os
import signal
import subprocess
import tempfile
import time
import unittest

import zmq

import strict_events as se
import test_relay_e2e
from test_relay_e2e import wait_for  # polls until true; fails after a bound

TIMEOUT_S = 60
# (key prefix, session, keys, value bytes, keys per request); "" = untagged.
WRITERS = [
    ("ascii", "engine-A", 40, 2048, 1),
    ("accented", "sessão-β", 40, 4096, 8),
    ("cjk", "会话-7", 40, 300, 40),
    ("emoji", "run-🚀", 40, 70000, 4),
    ("long", "é" * 128, 40, 1024, 8),  # 256 bytes of UTF-8: the longest session allowed
    ("untagged", "", 40, 512, 8),
]
SESSION_OF = {prefix: session for prefix, session, *_ in WRITERS}
REMOVED_BY_KVCTL = ["ascii-3", "cjk-5", "long-39"]
REMOVED_BY_CLIENT = ["untagged-0", "emoji-1", "accented-7"]


def stop_process(proc):
    """SIGTERM, then SIGKILL if it does not go within 20 s; always reaped."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Kvmaster:
    """A kvmaster process on loopback ports the OS picked (kept across restart())."""

    def __init__(self, directory, extra=()):
        self.dir = directory
        self.extra = list(extra)
        self.rpc, self.events, self.replay = ("tcp://127.0.0.1:0",) * 3
        self.proc = None
        self.start()

    def start(self):
        ready = os.path.join(self.dir, "master-ready")
        if os.path.exists(ready):
            os.unlink(ready)
        self.proc = subprocess.Popen(
            [os.environ["KVMASTER"], "--listen", self.rpc, "--events", self.events,
             "--events-replay", self.replay, "--ready-file", ready, *self.extra],
            stderr=subprocess.DEVNULL)

        def up():
            if self.proc.poll() is not None:
                return True
            if not os.path.exists(ready):
                return False
            with open(ready) as f:
                return "replay=" in f.read()
        wait_for(up, "kvmaster's ready file")
        if self.proc.poll() is not None:
            raise AssertionError(f"kvmaster exited with {self.proc.returncode}")
        with open(ready) as f:
            values = dict(line.strip().split("=", 1) for line in f if "=" in line)
        self.rpc, self.events, self.replay = values["rpc"], values["events"], values["replay"]

    def agent_args(self, events=None, replay=None):
        """kvagent flags that follow this master (its event endpoints may be overridden)."""
        return ["--master", self.rpc, "--master-events", events or self.events,
                "--master-events-replay", replay or self.replay]

    def stop(self):
        stop_process(self.proc)


class Kvagent:
    """A kvagent process in DIR/NAME; its log in DIR/NAME.log, whose ready line names its
    event endpoints."""

    def __init__(self, directory, name, args=()):
        self.run_dir = os.path.join(directory, name)
        self.log = os.path.join(directory, name + ".log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [os.environ["KVAGENT"], "--run-dir", self.run_dir, "--pool-size", "64MiB",
                 "--events-tcp", "tcp://127.0.0.1:0", *args],
                stdout=subprocess.DEVNULL, stderr=log)
        wait_for(lambda: self.ready_line() or self.proc.poll() is not None, "kvagent ready")
        if self.proc.poll() is not None:
            raise AssertionError(f"kvagent exited with {self.proc.returncode}; see {self.log}")
        # "..., events ipc://RUN/events.sock and tcp://127.0.0.1:PORT, clients on ..."
        line = self.ready_line()
        endpoints = line.split(", events ", 1)[1].split(", clients on", 1)[0].split(" and ")
        self.events_ipc, self.events_tcp = endpoints
        self.replay = f"ipc://{self.run_dir}/events-replay.sock"

    def ready_line(self):
        with open(self.log, encoding="utf-8", errors="replace") as f:
            for line in f:
                if "kvagent ready: " in line:
                    return line.strip()
        return None

    def kvctl(self, *args, check=True):
        """Runs kvctl against this agent; its CompletedProcess (stdout as text)."""
        r = subprocess.run([os.environ["KVCTL"], "--run-dir", self.run_dir, *args],
                           capture_output=True, timeout=TIMEOUT_S)
        if check and r.returncode != 0:
            raise AssertionError(f"kvctl {' '.join(args)}: exit {r.returncode}: "
                                 f"{r.stderr.decode(errors='replace')}")
        return r

    def listed(self, check=True):
        """The store's keys as `kvctl ls` prints them: key -> session ("" untagged); None when
        kvctl fails and not `check`."""
        r = self.kvctl("ls", check=check)
        if r.returncode != 0:
            return None
        out = {}
        for line in r.stdout.decode("utf-8").splitlines():
            key, _size, session = line.split("\t")
            out[key] = "" if session == "-" else session
        return out

    def counters(self):
        """`kvctl stat --raw`: counter name -> value (int), or its text when it has one."""
        out = {}
        for line in self.kvctl("stat", "--raw").stdout.decode("utf-8").splitlines():
            name, value, *text = line.split("\t")
            out[name] = text[0] if text else int(value)
        return out

    def client(self, *args):
        """Starts an e2e_client against this agent."""
        return subprocess.Popen([os.environ["E2E_CLIENT"], args[0], self.run_dir, *args[1:]],
                                stdout=subprocess.PIPE)

    def stop(self):
        stop_process(self.proc)


def run_clients(procs):
    """Waits for every e2e_client; fails naming the first that did not exit 0. Any still
    running when it fails is killed and reaped."""
    try:
        for p in procs:
            try:
                p.communicate(timeout=TIMEOUT_S * 2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
            if p.returncode != 0:
                raise AssertionError(f"{p.args[1]} {p.args[3]} exited with {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


# What a KV-aware router builds from a stream alone (object_key -> session), and how many
# AllBlocksCleared the stream holds: the relay tests' definitions.
index_of = test_relay_e2e.RelayEndToEnd.index_of
cleared_count = test_relay_e2e.RelayEndToEnd.cleared


class StoreTestCase(unittest.TestCase):
    """A temporary directory per test and the helpers every end-to-end event test uses."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="kvagent-e2e-py-")
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, 0)

    def start_master(self, *extra):
        master = Kvmaster(self.dir, extra)
        self.addCleanup(master.stop)
        return master

    def start_agent(self, name, *args):
        agent = Kvagent(self.dir, name, args)
        self.addCleanup(agent.stop)  # before the master's cleanup: agents stop first
        return agent

    def converged(self, agent):
        """Waits for a quiet point at which the index built from the agent's whole stream
        (replayed from seq 0, decoded strictly) equals `kvctl ls`; returns that history."""
        state = {}

        def same():
            state["history"] = se.replay(agent.replay, 0, context=self.ctx)
            state["index"] = index_of(state["history"])
            state["listed"] = agent.listed(check=False)  # None while its master is away
            return state["index"] == state["listed"]
        try:
            wait_for(same, "the agent's stream to describe the store", TIMEOUT_S)
        except AssertionError:
            self.assertEqual(state.get("index"), state.get("listed"))  # shows the difference
            raise
        history = state["history"]
        se.check_contiguous([m.seq for m in history], start=0)
        for m in history:
            se.assert_canonical(m.payload)
        return history

    def assert_sessions(self, history, written):
        """Every BlockStored of a written key names its writer's session (none if untagged);
        no BlockRemoved carries one; every written key was announced at least once."""
        announced = set()
        for m in history:
            for ev in m.batch.events:
                if ev["type"] == "BlockRemoved":
                    self.assertNotIn("session_id", ev)
                    self.assertEqual(ev["medium"], "EXTERNAL")
                if ev["type"] != "BlockStored":
                    continue
                key = ev["object_key"]
                announced.add(key)
                session = SESSION_OF[key.rsplit("-", 1)[0]]
                if session:
                    self.assertEqual(ev.get("session_id"), session, key)
                else:
                    self.assertNotIn("session_id", ev, key)
                self.assertEqual(ev["medium"], "EXTERNAL")
        self.assertEqual(announced, set(written))

    @staticmethod
    def keys_of(writers):
        return [f"{prefix}-{i}" for prefix, _s, count, *_ in writers for i in range(count)]

    def write_and_remove(self, agents):
        """Runs every writer at once (writer i on agents[i % len(agents)]), then removes
        REMOVED_BY_KVCTL with kvctl and REMOVED_BY_CLIENT with one e2e_client."""
        procs = [agents[i % len(agents)].client("write", prefix, str(count), str(size),
                                                session, str(batch))
                 for i, (prefix, session, count, size, batch) in enumerate(WRITERS)]
        run_clients(procs)
        for key in REMOVED_BY_KVCTL:
            agents[0].kvctl("rm", key)
        run_clients([agents[-1].client("remove", *REMOVED_BY_CLIENT)])

    def check_live(self, subscribers, history):
        """The live subscribers got the stream's tail with the very bytes replay serves."""
        by_seq = {m.seq: m.payload for m in history}
        for sub in subscribers:
            live = sub.collect_until(history[-1].seq, timeout_ms=TIMEOUT_S * 1000)
            self.assertTrue(live)
            for m in live:
                self.assertEqual(m.payload, by_seq[m.seq], f"live and replay differ at {m.seq}")


class StandaloneEvents(StoreTestCase):
    def test_every_stored_block_names_its_writers_session(self):
        agent = self.start_agent("node")
        with se.Subscriber(agent.events_ipc, context=self.ctx) as ipc, \
                se.Subscriber(agent.events_tcp, context=self.ctx) as tcp:
            time.sleep(0.3)  # lets the subscriptions reach the agent (not an assertion)
            self.write_and_remove([agent])
            history = self.converged(agent)
            self.check_live([ipc, tcp], history)
        self.assertEqual(history[0].batch.events[0], {"type": "AllBlocksCleared"})
        self.assertEqual(cleared_count(history), 1)
        self.assert_sessions(history, self.keys_of(WRITERS))
        removed = {ev["object_key"] for m in history for ev in m.batch.events
                   if ev["type"] == "BlockRemoved"}
        self.assertEqual(removed, set(REMOVED_BY_KVCTL + REMOVED_BY_CLIENT))


class RemoteEvents(StoreTestCase):
    def test_both_agents_relay_every_writers_session_of_both_nodes(self):
        master = self.start_master()
        agents = [self.start_agent(name, *master.agent_args(), "--data-listen", "127.0.0.1:0")
                  for name in ("node-a", "node-b")]
        subs = [se.Subscriber(a.events_ipc, context=self.ctx) for a in agents]
        subs += [se.Subscriber(a.events_tcp, context=self.ctx) for a in agents]
        try:
            time.sleep(0.3)  # lets the subscriptions reach the agents (not an assertion)
            self.write_and_remove(agents)
            for i, agent in enumerate(agents):
                history = self.converged(agent)
                self.check_live([subs[i], subs[i + 2]], history)
                self.assertEqual(history[0].batch.events[0], {"type": "AllBlocksCleared"})
                self.assert_sessions(history, self.keys_of(WRITERS))
        finally:
            for s in subs:
                s.close()
        self.assertEqual(agents[0].listed(), agents[1].listed())


if __name__ == "__main__":
    unittest.main()
