"""Test support for the operations tests: real kvmaster / kvagent / kvctl processes in a fresh
temporary directory, always stopped (SIGKILL + wait) when the test ends, pass or fail.

Environment: KVAGENT, KVMASTER, KVCTL (paths to the binaries).
"""
import os
import socket
import subprocess
import tempfile
import time
import urllib.request

LIMIT_S = 30  # bounds waits for asynchronous effects; nothing asserts on the time taken


def wait_for(predicate, what, limit_s=LIMIT_S):
    """Polls predicate() until it returns a true value, which it returns; fails after limit_s."""
    end = time.monotonic() + limit_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def free_port():
    """A TCP port nobody listens on right now (for servers that cannot take port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    """(status, body) of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def parse_metrics(text):
    """{'name{labels}': value} of a Prometheus text exposition (labels as written)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


class Processes:
    """Starts binaries in one temporary directory; stop() kills and reaps every one."""

    def __init__(self, prefix):
        self.tmp = tempfile.TemporaryDirectory(prefix=prefix)
        self.dir = self.tmp.name
        self.procs = []

    def start(self, args, log_name, env=None):
        log = open(os.path.join(self.dir, log_name), "wb")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        self.procs.append(p)
        return p

    def log(self, log_name):
        with open(os.path.join(self.dir, log_name), errors="replace") as f:
            return f.read()

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.kill()
            p.wait()
        self.tmp.cleanup()

    def kvmaster(self, *extra, prefix=()):
        """Starts kvmaster on loopback ephemeral ports; returns {rpc, events, replay, metrics?}.
        prefix: a command that execs it (e.g. prlimit with its limits)."""
        ready = os.path.join(self.dir, "master.ready")
        p = self.start([*prefix, os.environ["KVMASTER"], "--listen", "tcp://127.0.0.1:0", "--events",
                        "tcp://127.0.0.1:0", "--events-replay", "tcp://127.0.0.1:0",
                        "--framed-listen", "tcp://127.0.0.1:0", "--ready-file", ready, *extra],
                       "kvmaster.log")
        wait_for(lambda: os.path.exists(ready) or p.poll() is not None, "kvmaster's ready file")
        if p.poll() is not None:
            raise AssertionError("kvmaster exited: " + self.log("kvmaster.log"))
        with open(ready) as f:
            return dict(line.strip().split("=", 1) for line in f if "=" in line)

    def kvagent(self, name, *extra, master=None, env=None, event_flags=True, prefix=()):
        """Starts kvagent (64 MiB pool) in run dir <tmp>/<name>; waits until it answers. With a
        master, passes its event endpoints as flags unless event_flags is False (the master
        then tells them at registration). prefix: as for kvmaster."""
        run_dir = os.path.join(self.dir, name)
        args = [*prefix, os.environ["KVAGENT"], "--run-dir", run_dir, "--pool-size", "64MiB"]
        if master:
            args += ["--master", master["rpc"]]
            if event_flags:
                args += ["--master-events", master["events"],
                         "--master-events-replay", master["replay"]]
        p = self.start(args + list(extra), name + ".log", env=env)
        if self.kvctl(run_dir, "ping", "--wait-ms", str(LIMIT_S * 1000)).returncode != 0:
            raise AssertionError("kvagent did not answer: " + self.log(name + ".log"))
        return run_dir, p

    @staticmethod
    def kvctl(run_dir, *args, stdin=None):
        return subprocess.run([os.environ["KVCTL"], "--run-dir", run_dir, *args],
                              capture_output=True, text=stdin is None or isinstance(stdin, str),
                              input=stdin, timeout=LIMIT_S)

    @classmethod
    def stat(cls, run_dir):
        """kvctl stat --raw as {name: (value, text)}."""
        r = cls.kvctl(run_dir, "stat", "--raw")
        if r.returncode != 0:
            raise AssertionError("kvctl stat failed: " + r.stderr)
        out = {}
        for line in r.stdout.splitlines():
            parts = line.split("\t")
            out[parts[0]] = (int(parts[1]), parts[2] if len(parts) > 2 else "")
        return out
