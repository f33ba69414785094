#!/usr/bin/python3
"""Day-2 operations with the real binaries: --version everywhere; kvmaster --log-dir is checked
at start and writes its files there; `kvctl ping` says when the agent is degraded; `kvctl put
--file -` takes values larger than the arena it used to ask for.

Environment: KVAGENT, KVMASTER, KVCTL, KVAGENT_VERSION.
"""
import glob
import os
import subprocess
import unittest

from ops_support import LIMIT_S, Processes, wait_for


def run(args, **kw):
    return subprocess.run(args, capture_output=True, timeout=120, **kw)


class VersionTest(unittest.TestCase):
    def test_every_binary_prints_the_release(self):
        for name in ("KVAGENT", "KVMASTER", "KVCTL"):
            r = run([os.environ[name], "--version"], text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            binary = os.path.basename(os.environ[name])
            self.assertEqual(r.stdout, f"{binary} {os.environ['KVAGENT_VERSION']}\n")


class LogDirTest(unittest.TestCase):
    def setUp(self):
        self.p = Processes("kvagent-logdir-")
        self.addCleanup(self.p.stop)

    def test_a_missing_or_non_directory_log_dir_is_a_flag_error(self):
        missing = os.path.join(self.p.dir, "missing")
        not_dir = os.path.join(self.p.dir, "file")
        open(not_dir, "w").close()
        for path, words in ((missing, "No such file or directory"), (not_dir, "not a directory")):
            r = run([os.environ["KVMASTER"], "--log-dir", path, "--listen", "tcp://127.0.0.1:0",
                     "--events", "tcp://127.0.0.1:0", "--events-replay", "tcp://127.0.0.1:0"],
                    text=True)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"--log-dir {path}", r.stderr)
            self.assertIn(words, r.stderr)

    def test_logs_go_to_the_log_dir(self):
        logs = os.path.join(self.p.dir, "logs")
        os.mkdir(logs)
        self.p.kvmaster("--log-dir", logs, "--log-max-mb", "1", "--log-keep-days", "1")
        files = wait_for(lambda: glob.glob(os.path.join(logs, "kvmaster*.log.INFO.*")),
                         "a kvmaster INFO log file")
        def serving_logged():
            with open(files[0]) as f:
                return "kvmaster serving" in f.read()
        wait_for(serving_logged, "the serving line in the log file")


class PingDegradedTest(unittest.TestCase):
    def setUp(self):
        self.p = Processes("kvagent-ping-")
        self.addCleanup(self.p.stop)

    def test_ping_says_when_the_master_link_is_down(self):
        nowhere = {"rpc": "tcp://127.0.0.1:1", "events": "tcp://127.0.0.1:1",
                   "replay": "tcp://127.0.0.1:1"}
        run_dir, _ = self.p.kvagent("a", "--master-ready-wait-ms", "0", master=nowhere)
        r = self.p.kvctl(run_dir, "ping")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("answered in", r.stdout)
        self.assertIn("DEGRADED: the master link is down", r.stdout)
        self.assertIn("MASTER_UNAVAILABLE", r.stdout)

    def test_a_healthy_agent_is_not_called_degraded(self):
        run_dir, _ = self.p.kvagent("a")
        r = self.p.kvctl(run_dir, "ping")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("DEGRADED", r.stdout)


class ConfigAndFlagsTest(unittest.TestCase):
    """The real kvagent with config files: toml++ errors name file and line, --config needs a
    path, and a list flag on the command line replaces the file's list."""

    def setUp(self):
        self.p = Processes("kvagent-config-")
        self.addCleanup(self.p.stop)

    def write(self, name, text):
        path = os.path.join(self.p.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_errors_name_the_file_and_line(self):
        bad_key = self.write("a.toml", 'pool_size = "64MiB"\n\npool_sise = "1GiB"\n')
        r = run([os.environ["KVAGENT"], "--config", bad_key, "--help"], text=True)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr, f"kvagent: {bad_key}:3: unknown option 'pool_sise'\n")
        bad_value = self.write("b.toml", '[data]\nlisten = "127.0.0.1:7000"\ntransport = "udp"\n')
        r = run([os.environ["KVAGENT"], "--config", bad_value, "--run-dir",
                 os.path.join(self.p.dir, "run")], text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("udp", r.stderr)
        r = run([os.environ["KVAGENT"], "--config"], text=True)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr, "kvagent: --config needs a value: the config file's path\n")

    def test_a_list_flag_replaces_the_files_list(self):
        # The file allows uid 65534 (nobody); the command line allows only uid 12345: nobody is
        # refused. (The agent's own uid and root may always attach, so the client runs as nobody.)
        os.chmod(self.p.dir, 0o755)
        conf = self.write("c.toml", 'allow_uid = ["65534"]\n')

        def ping_as_nobody(run_dir):
            return subprocess.run([os.environ["KVCTL"], "--run-dir", run_dir, "ping"],
                                  capture_output=True, text=True, timeout=LIMIT_S,
                                  preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))

        for name, extra, allowed in (("file", [], True), ("flag", ["--allow-uid", "12345"], False)):
            run_dir = os.path.join(self.p.dir, name)
            self.p.start([os.environ["KVAGENT"], "--run-dir", run_dir, "--pool-size", "16MiB",
                          "--config", conf, *extra], name + ".log")
            wait_for(lambda: os.path.exists(os.path.join(run_dir, "agent.sock")), "agent.sock")
            r = ping_as_nobody(run_dir)
            if allowed:
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            else:
                self.assertEqual(r.returncode, 1, r.stdout)
                self.assertIn("may not attach", r.stderr)


class PutFromStdinTest(unittest.TestCase):
    def test_a_large_value_from_standard_input_round_trips(self):
        p = Processes("kvagent-stdin-")
        self.addCleanup(p.stop)
        run_dir, _ = p.kvagent("a")
        value = os.urandom(6 << 20)  # above the 4 MiB arena kvctl used to ask for a stream
        r = p.kvctl(run_dir, "put", "big", "--file", "-", stdin=value)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, b"stored big (6291456 bytes)\n")
        got = p.kvctl(run_dir, "get", "big", stdin=b"")
        self.assertEqual(got.returncode, 0, got.stderr)
        self.assertEqual(got.stdout, value)
        # Beyond what the agent grants (--max-arena-bytes), the hint names that flag.
        run_dir2, _ = p.kvagent("b", "--max-arena-bytes", "2MiB")
        r = p.kvctl(run_dir2, "put", "big", "--file", "-", stdin=value)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"raise kvagent --max-arena-bytes", r.stderr)


if __name__ == "__main__":
    unittest.main()
