#!/usr/bin/python3
"""Start-up and wiring of the real binaries:
- a taken port (data plane, --events-tcp, metrics) fails start-up before the pool is pre-faulted;
- systemd hears EXTEND_TIMEOUT_USEC while the pool is pre-faulted, then READY=1;
- kvmaster tells agents where its events are (a master on other ports is followed without
  --master-events);
- the sample configs start on a small node, and the suggested --events-tcp port is not one of
  kvmaster's;
- each daemon raises its file descriptor limit to the hard one; out of descriptors, kvmaster
  says so once, goes on serving, and takes new agents again once descriptors are free.

Environment: KVAGENT, KVMASTER, KVCTL, SAMPLE_CONFIG_DIR.
"""
import os
import re
import socket
import subprocess
import unittest

from ops_support import LIMIT_S, Processes, http_get, parse_metrics, wait_for


def run_to_exit(args, env=None):
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)


class TakenPortTest(unittest.TestCase):
    """A port in use is reported at once: the log has no 'pre-faulted' line before the error."""

    def setUp(self):
        self.p = Processes("kvagent-startup-")
        self.addCleanup(self.p.stop)
        self.taken = socket.socket()
        self.addCleanup(self.taken.close)
        self.taken.bind(("127.0.0.1", 0))
        self.taken.listen(1)
        self.port = self.taken.getsockname()[1]

    def start_agent(self, *extra):
        return run_to_exit([os.environ["KVAGENT"], "--run-dir", os.path.join(self.p.dir, "run"),
                            "--pool-size", "2GiB", *extra])

    def check(self, r, words):
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("kvagent cannot start", r.stderr)
        self.assertIn(words, r.stderr)
        self.assertIn(str(self.port), r.stderr)
        self.assertNotIn("pre-faulted", r.stderr)

    def test_data_port(self):
        self.check(self.start_agent("--data-listen", f"127.0.0.1:{self.port}"), "data plane")

    def test_events_tcp_standalone(self):
        self.check(self.start_agent("--events-tcp", f"tcp://127.0.0.1:{self.port}"),
                   "embedded master")

    def test_events_tcp_with_a_master(self):
        master = self.p.kvmaster()
        self.check(self.start_agent("--master", master["rpc"], "--events-tcp",
                                    f"tcp://127.0.0.1:{self.port}"), "event relay")

    def test_metrics_port(self):
        self.check(self.start_agent("--metrics-listen", f"127.0.0.1:{self.port}"), "metrics")


class SystemdStartTest(unittest.TestCase):
    def test_extend_timeout_while_prefaulting_then_ready(self):
        p = Processes("kvagent-extend-")
        self.addCleanup(p.stop)
        path = os.path.join(p.dir, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(sock.close)
        sock.bind(path)
        sock.settimeout(LIMIT_S)
        env = dict(os.environ, NOTIFY_SOCKET=path)
        p.kvagent("a", "--pool-size", "1536MiB", env=env)
        messages = []
        while not messages or not messages[-1].startswith("READY=1"):
            messages.append(sock.recv(4096).decode())
        extends = [m for m in messages if m.startswith("EXTEND_TIMEOUT_USEC=")]
        # One before the first step and one after each (1 GiB + 512 MiB), all before READY.
        self.assertEqual(len(extends), 3, messages)
        self.assertTrue(extends[0].startswith(
            "EXTEND_TIMEOUT_USEC=60000000\nSTATUS=kvagent: pre-faulting the node pool: 0"),
            extends[0])
        self.assertTrue(extends[-1].endswith("1.50 GiB of 1.50 GiB"), extends[-1])
        self.assertEqual(messages[-1].split("\n")[0], "READY=1")


class MasterTellsEventEndpointsTest(unittest.TestCase):
    def test_agent_follows_a_master_on_other_ports_without_event_flags(self):
        p = Processes("kvagent-events-wiring-")
        self.addCleanup(p.stop)
        master = p.kvmaster()  # ephemeral ports: nothing at the old guess (master host, 5557)
        run_dir, _ = p.kvagent("a", master=master, event_flags=False)
        wait_for(lambda: p.stat(run_dir)["agent.relay.phase"][1] == "live", "relay live")
        self.assertEqual(p.kvctl(run_dir, "put", "wired", "--value", "v", "--session",
                                 "s").returncode, 0)
        # The agent's stream: the relay's AllBlocksCleared, then the put as kvmaster published it.
        r = p.kvctl(run_dir, "events", "tail", "--from-seq", "0", "--count", "2", "--timeout-ms",
                    "20000")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("key=wired", r.stdout, r.stdout + r.stderr)
        self.assertIn("as its registration reply said", p.log("a.log"))


class SampleConfigTest(unittest.TestCase):
    def test_the_sample_configs_start_on_a_small_node(self):
        p = Processes("kvagent-samples-")
        self.addCleanup(p.stop)
        conf = os.environ["SAMPLE_CONFIG_DIR"]
        state = os.path.join(p.dir, "state")
        # The sample names the secret where systemd's LoadCredential= puts it; here, one of ours.
        secret = os.path.join(p.dir, "cluster-secret")
        made = subprocess.run([os.environ["KVCTL"], "secret", "generate", secret],
                              capture_output=True, text=True, timeout=LIMIT_S)
        self.assertEqual(made.returncode, 0, made.stderr)
        master = p.kvmaster("--config", os.path.join(conf, "master.toml"), "--state-dir", state,
                            "--cluster-secret-file", secret)
        with open(os.path.join(conf, "master.toml")) as f:
            self.assertIn("cluster_secret_file =", f.read())
        run_dir, _ = p.kvagent("a", "--config", os.path.join(conf, "agent.toml"),
                               "--pool-size", "1GiB")  # the sample's own size, stated
        stat = p.stat(run_dir)
        self.assertLessEqual(stat["agent.pool_bytes"][0], 1 << 30)
        self.assertEqual(p.kvctl(run_dir, "put", "k", "--value", "v").returncode, 0)
        with open(os.path.join(conf, "agent.toml")) as f:
            self.assertIn('pool_size = "1GiB"', f.read())
        self.assertTrue(master["rpc"].startswith("tcp://127.0.0.1:"))

    def test_suggested_events_tcp_port_is_not_kvmasters(self):
        help_text = run_to_exit([os.environ["KVAGENT"], "--help"]).stdout
        master_help = run_to_exit([os.environ["KVMASTER"], "--help"]).stdout
        master_ports = set(re.findall(r"tcp://0\.0\.0\.0:(\d+)", master_help))
        self.assertTrue({"5557", "5558", "50051"} <= master_ports, master_ports)
        line = help_text[help_text.index("--events-tcp"):].split("\n--")[0]
        suggested = re.findall(r"tcp://0\.0\.0\.0:(\d+)", line)
        with open(os.path.join(os.environ["SAMPLE_CONFIG_DIR"], "agent.toml")) as f:
            suggested += re.findall(r"events_tcp = \"tcp://0\.0\.0\.0:(\d+)\"", f.read())
        self.assertEqual(len(suggested), 2, suggested)
        for port in suggested:
            self.assertNotIn(port, master_ports)


if __name__ == "__main__":
    unittest.main()


def soft_fd_limit(pid):
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no 'Max open files' in /proc/%d/limits" % pid)


class FdLimitTest(unittest.TestCase):
    def setUp(self):
        self.p = Processes("kvagent-fds-")
        self.addCleanup(self.p.stop)

    def test_soft_limit_is_raised_to_the_hard_one(self):
        limits = ("prlimit", "--nofile=256:4096")
        master = self.p.kvmaster("--metrics-listen", "127.0.0.1:0", prefix=limits)
        kvmaster = self.p.procs[-1]
        run_dir, kvagent = self.p.kvagent("a", "--metrics-listen", "127.0.0.1:0", master=master,
                                          prefix=limits)
        agent_metrics = self.p.stat(run_dir)["agent.metrics_endpoint"][1]
        for proc, url, log in ((kvmaster, master["metrics"], "kvmaster.log"),
                               (kvagent, agent_metrics, "a.log")):
            self.assertEqual(soft_fd_limit(proc.pid), 4096, log)
            self.assertIn("file descriptors: up to 4096 (raised from 256; hard limit 4096)",
                          self.p.log(log))
            m = parse_metrics(http_get(url)[1])
            self.assertEqual(m["process_max_fds"], 4096, log)
            self.assertGreater(m["process_open_fds"], 3, log)
            self.assertLess(m["process_open_fds"], 4096, log)

    def test_kvmaster_out_of_descriptors_says_so_and_serves_again(self):
        master = self.p.kvmaster(prefix=("prlimit", "--nofile=64:64"))
        kvmaster = self.p.procs[-1]
        run_a, _ = self.p.kvagent("a", master=master)
        host, port = master["rpc"].rsplit("/", 1)[1].rsplit(":", 1)
        held = []
        self.addCleanup(lambda: [s.close() for s in held])
        for _ in range(60):  # more than are left; the rest wait in the listen backlog
            try:
                held.append(socket.create_connection((host, int(port)), timeout=5))
            except OSError:
                break
        warning = "file descriptors in use: while none is left, new connections"
        wait_for(lambda: warning in self.p.log("kvmaster.log"), "kvmaster's warning")
        # The agent it already serves goes on storing.
        r = self.p.kvctl(run_a, "put", "during", "--value", "v")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for s in held:
            s.close()
        wait_for(lambda: "file descriptors back to" in self.p.log("kvmaster.log"),
                 "kvmaster's all-clear")
        # A new agent connects and stores; the warning was given once.
        run_b, _ = self.p.kvagent("b", master=master)
        r = self.p.kvctl(run_b, "put", "after", "--value", "v")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIsNone(kvmaster.poll())
        self.assertEqual(self.p.log("kvmaster.log").count(warning), 1)
