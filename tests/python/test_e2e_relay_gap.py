#!/usr/bin/python3
"""The agent's event relay repairs a gap after its link to kvmaster is cut briefly — with the
real processes: a kvmaster, a kvagent following it ("node-b", the one under test) and a second
kvagent ("node-a") whose clients keep writing while node-b is cut off.

How the link is cut: node-b reaches the master's event sockets through TcpLink, a TCP proxy in
this test process. cut() closes every connection through it and refuses new ones (accepts and
closes them at once) until restore() — to node-b it looks like the network to the master went
away and came back; the master's PUB drops what it publishes meanwhile for node-b. Its RPC link
stays direct in RelayGapRepair (so its own clients keep working during the cut), and is cut too
in WholeLinkCut.

Checked on node-b's stream (replay from seq 0 and live, decoded strictly as
strict_events.py does): nothing was relayed while cut; afterwards seq is contiguous from 0, the
batches published during the cut are there with each writer's session, the only
AllBlocksCleared is the one a new stream starts with (replay repaired the gap; nothing had to be
re-announced: `kvctl stat` counts a repaired gap and no unrepaired one), and the index built
from the stream equals the store's key set (`kvctl ls`).

Environment: KVAGENT, KVMASTER, KVCTL, E2E_CLIENT (paths to the binaries).
"""
import select
import socket
import threading
import time
import unittest

import strict_events as se
from test_e2e_events import StoreTestCase, cleared_count, run_clients, wait_for

SESSIONS = ["sess-1", "sessão-β", "会话-7", "run-🚀", "é" * 128]


class TcpLink(threading.Thread):
    """Forwards 127.0.0.1:<port> to a tcp://HOST:PORT endpoint; cut() and restore() it."""

    def __init__(self, upstream):
        super().__init__(daemon=True)
        host, port = upstream[len("tcp://"):].rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.endpoint = "tcp://127.0.0.1:%d" % self.listener.getsockname()[1]
        self.peer = {}  # each open socket -> the other end of its connection
        self.is_cut = False
        self.refused = 0  # connections accepted and closed while cut
        self.requests = []  # (wanted state, threading.Event) for the proxy thread
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def cut(self):
        self._request(True)

    def restore(self):
        self._request(False)

    def _request(self, cut):
        done = threading.Event()
        with self.lock:
            self.requests.append((cut, done))
        if not done.wait(10):
            raise AssertionError("the proxy thread did not answer")

    def run(self):
        try:
            while not self.stopping.is_set():
                with self.lock:
                    requests, self.requests = self.requests, []
                for cut, done in requests:
                    self.is_cut = cut
                    if cut:
                        for s in list(self.peer):
                            self._close(s)
                    done.set()
                readable, _, _ = select.select([self.listener, *self.peer], [], [], 0.02)
                for s in readable:
                    if s is self.listener:
                        self._accept()
                    elif s in self.peer:
                        self._forward(s)
        finally:
            for s in list(self.peer):
                self._close(s)
            self.listener.close()

    def _accept(self):
        conn, _ = self.listener.accept()
        if self.is_cut:
            self.refused += 1
            conn.close()
            return
        try:
            up = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            conn.close()
            return
        self.peer[conn], self.peer[up] = up, conn

    def _forward(self, s):
        try:
            data = s.recv(1 << 16)
            if data:
                self.peer[s].sendall(data)
                return
        except OSError:
            pass
        self._close(s)

    def _close(self, s):
        other = self.peer.pop(s, None)
        s.close()
        if other is not None:
            self.peer.pop(other, None)
            other.close()

    def stop(self):
        self.stopping.set()
        self.join(10)


class RelayGapTestCase(StoreTestCase):
    cut_rpc = False  # WholeLinkCut: node-b's RPC link goes through a TcpLink too

    def setUp(self):
        super().setUp()
        self.master = self.start_master("--agent-ttl-ms", "600000")
        self.links = {}
        for name in ("events", "replay") + (("rpc",) if self.cut_rpc else ()):
            link = TcpLink(getattr(self.master, name))
            link.start()
            self.addCleanup(link.stop)
            self.links[name] = link
        self.node_a = self.start_agent("node-a", *self.master.agent_args(),
                                       "--data-listen", "127.0.0.1:0")
        b_args = self.master.agent_args(self.links["events"].endpoint,
                                        self.links["replay"].endpoint)
        if self.cut_rpc:
            # The link forwards kvmaster's ROUTER only; on the same host, the default transport
            # would find kvmaster's framed port directly, around the link.
            b_args[1:2] = [self.links["rpc"].endpoint, "--master-transport", "zmq"]
        self.node_b = self.start_agent("node-b", *b_args, "--data-listen", "127.0.0.1:0",
                                       "--heartbeat-ms", "200", "--master-timeout-ms", "2000")

    def write(self, agent, prefix, count, session):
        run_clients([agent.client("write", prefix, str(count), "1024", session, "4")])

    def cut(self):
        for link in self.links.values():
            link.cut()

    def restore(self):
        # Replay (and RPC) first: when the event link's first batch shows the gap, the relay's
        # replay request finds its way open.
        for link in reversed(list(self.links.values())):
            link.restore()

    def settled_seq(self, agent, quiet_s=0.3):
        """The agent's last published seq once it has published nothing new for `quiet_s`: its
        stream can describe the store (converged) while a batch is still on its way (a master
        batch the re-announce held back), and on a fast machine that batch came out after the
        cut had begun."""
        state = {"seq": None, "since": time.monotonic()}

        def quiet():
            seq = se.replay(agent.replay, 0, context=self.ctx)[-1].seq
            now = time.monotonic()
            if seq != state["seq"]:
                state.update(seq=seq, since=now)
            return now - state["since"] >= quiet_s
        wait_for(quiet, "the agent's stream to settle")
        return state["seq"]

    def master_next_seq(self):
        history = se.replay(self.master.replay, 0, context=self.ctx)
        return history[-1].seq + 1 if history else 0

    def run_cut(self, write_during_cut):
        """Writes before, during and after a cut of node-b's link; returns node-b's stream at
        the end and the key -> session every writer used."""
        sessions = {}
        for i in range(3):
            self.write(self.node_a, f"before-{i}", 5, SESSIONS[i])
            sessions.update({f"before-{i}-{k}": SESSIONS[i] for k in range(5)})
        self.converged(self.node_b)
        b_seq = self.settled_seq(self.node_b)
        with se.Subscriber(self.node_b.events_ipc, context=self.ctx) as live:
            self.cut()
            master_seq = self.master_next_seq()
            write_during_cut(sessions)
            wait_for(lambda: self.master_next_seq() >= master_seq + 2,
                     "the master to publish during the cut")
            wait_for(lambda: self.links["events"].refused > 0,
                     "node-b to try its event link again while it is cut")
            # node-b relayed nothing while cut off (what it has is unchanged) ...
            self.assertEqual(se.replay(self.node_b.replay, 0, context=self.ctx)[-1].seq, b_seq)
            self.restore()
            self.write(self.node_a, "after", 5, SESSIONS[4])
            sessions.update({f"after-{k}": SESSIONS[4] for k in range(5)})
            history = self.converged(self.node_b)  # ... and then all of it, in order
            by_seq = {m.seq: m.payload for m in history}
            for m in live.collect_until(history[-1].seq, timeout_ms=60000):
                self.assertEqual(m.payload, by_seq[m.seq], f"live and replay differ at {m.seq}")
        stored = {ev["object_key"]: ev.get("session_id", "") for m in history
                  for ev in m.batch.events if ev["type"] == "BlockStored"}
        for key, session in sessions.items():
            self.assertEqual(stored.get(key), session, key)
        return history


class RelayGapRepair(RelayGapTestCase):
    def test_gap_is_repaired_by_replay_after_the_event_link_is_cut_briefly(self):
        def during(sessions):
            # Both nodes' clients write while node-b's event link is down; node-b's RPC works.
            for i, node in enumerate((self.node_a, self.node_b, self.node_a)):
                self.write(node, f"during-{i}", 5, SESSIONS[i + 1])
                sessions.update({f"during-{i}-{k}": SESSIONS[i + 1] for k in range(5)})
            run_clients([self.node_b.client("remove", "before-0-1", "before-2-4")])
            del sessions["before-0-1"], sessions["before-2-4"]
        history = self.run_cut(during)
        self.assertEqual(cleared_count(history), 1, "a re-announce replaced the replay repair")
        relay = self.node_b.counters()
        self.assertEqual(relay["agent.relay.phase"], "live")
        self.assertGreaterEqual(relay["agent.relay.repaired_gaps"], 1)
        self.assertEqual(relay["agent.relay.unrepaired_gaps"], 0)
        self.assertEqual(relay["agent.relay.reannounces"], 1)  # the one every relay starts with
        index = {ev["object_key"] for m in history for ev in m.batch.events
                 if ev["type"] == "BlockRemoved"}
        self.assertEqual(index, {"before-0-1", "before-2-4"})


class WholeLinkCut(RelayGapTestCase):
    cut_rpc = True

    def test_after_a_whole_link_cut_node_b_serves_again_and_its_stream_converges(self):
        def during(sessions):
            for i in range(2):
                self.write(self.node_a, f"during-{i}", 5, SESSIONS[i + 1])
                sessions.update({f"during-{i}-{k}": SESSIONS[i + 1] for k in range(5)})
            # node-b's own clients fail fast and cleanly meanwhile.
            r = self.node_b.kvctl("put", "while-cut", "--value", "v", check=False)
            self.assertEqual(r.returncode, 1)
            self.assertIn(b"MASTER_UNAVAILABLE", r.stderr)
        self.run_cut(during)

        def b_serves():
            return self.node_b.kvctl("put", "b-after", "--value", "v", "--session", "sess-1",
                                     check=False).returncode == 0
        wait_for(b_serves, "node-b to serve writes again")
        history = self.converged(self.node_b)
        counters = self.node_b.counters()
        self.assertGreaterEqual(counters["agent.master_link.link_downs"], 1)  # the cut was real
        self.assertEqual(counters["agent.relay.phase"], "live")
        # The same kvmaster answered after the cut: replay repairs the stream, no re-announce
        # (the master link re-registers, but only a new master epoch asks for one).
        self.assertEqual(counters["agent.relay.reannounces"], 1)  # the one every relay starts with
        self.assertEqual(cleared_count(history), 1)
        self.assertEqual(self.node_a.listed(), self.node_b.listed())
        self.assertEqual(history[-1].batch.events[-1]["object_key"], "b-after")


if __name__ == "__main__":
    unittest.main()
