#!/usr/bin/python3
"""The /metrics endpoints of kvagent and kvmaster (--metrics-listen).

- Every counter `kvctl stat` shows has a row in the metrics table of docs/operations.md, and the
  metric that row names is in the scrape (agent.* from the agent; master.* from kvmaster, or from
  a standalone agent's embedded master), with the same value where the value is at rest.
- The real Prometheus server (Debian's package) scrapes a running agent and master on loopback,
  and queries through its HTTP API return the counters' values after known puts.
- A bad or taken --metrics-listen is refused.
- Clients that connect and send nothing, or half a request, do not hold a scrape off.

Environment: KVAGENT, KVMASTER, KVCTL, OPERATIONS_MD, PROMETHEUS (path of the prometheus binary).
"""
import json
import os
import re
import select
import socket
import subprocess
import unittest
import urllib.parse

from ops_support import Processes, free_port, http_get, parse_metrics, wait_for


def metrics_table():
    """{stat name or pattern: [metric cells]} from the `kvctl stat` -> metric table."""
    rows = {}
    with open(os.environ["OPERATIONS_MD"]) as f:
        for line in f:
            m = re.match(r"^\| `((?:agent|master)\.[^`]+)` \| (.+?) \| (counter|gauge|info|-) \|",
                         line)
            if m:
                rows[m.group(1)] = re.findall(r"`(kv(?:agent|master)_[^`]+)`", m.group(2))
    return rows


def row_for(rows, stat_name):
    if stat_name in rows:
        return stat_name, rows[stat_name]
    for pattern, metrics in rows.items():
        if "<op>" in pattern:
            prefix = pattern.split("<op>")[0]
            if stat_name.startswith(prefix):
                return pattern, metrics
    return None, None


def expected_samples(metric_cells, stat_name, pattern, text, value):
    """The sample keys a scrape must hold for one stat counter."""
    out = []
    for cell in metric_cells:
        m = re.match(r"^([a-z_]+)(?:\{(\w+)\})?$", cell)
        assert m, f"bad metric cell {cell!r}"
        name, label = m.group(1), m.group(2)
        if label == "op":
            op = stat_name[len(pattern.split("<op>")[0]):]
            out.append(f'{name}{{op="{op}"}}')
        elif label:
            # Info metrics carry the counter's text, or (an identifier) its value, as the label.
            out.append(f'{name}{{{label}="{text or value}"}}')
        else:
            out.append(name)
    return out


class MetricsNamesTest(unittest.TestCase):
    def setUp(self):
        self.p = Processes("kvagent-metrics-")
        self.addCleanup(self.p.stop)
        self.rows = metrics_table()
        self.assertGreater(len(self.rows), 40, "the metrics table of operations.md was not found")

    def check(self, run_dir, scrapes):
        """scrapes: {'agent.': url, 'master.': url}."""
        stat = self.p.stat(run_dir)
        texts = {prefix: http_get(url)[1] for prefix, url in scrapes.items()}
        for prefix, text in texts.items():
            unnamed = [line for line in text.splitlines() if "no stable name yet" in line]
            self.assertEqual(unnamed, [], f"{prefix}* counters without a stable name")
        samples = {prefix: parse_metrics(text) for prefix, text in texts.items()}
        for name, (value, text) in stat.items():
            pattern, cells = row_for(self.rows, name)
            self.assertIsNotNone(pattern, f"kvctl stat counter {name} is not in operations.md")
            if cells == ["-"] or not cells:
                continue
            prefix = name.split(".")[0] + "."
            for key in expected_samples(cells, name, pattern, text, value):
                self.assertIn(key, samples[prefix], f"{name}: {key} missing from /metrics")

    def test_standalone_agent(self):
        port = free_port()
        run_dir, _ = self.p.kvagent("a", "--metrics-listen", f"127.0.0.1:{port}")
        for i in range(3):
            self.assertEqual(self.p.kvctl(run_dir, "put", f"k{i}", "--value", "x" * 100,
                                          "--session", "s").returncode, 0)
        url = self.p.stat(run_dir)["agent.metrics_endpoint"][1]
        self.assertEqual(url, f"http://127.0.0.1:{port}/metrics")
        self.check(run_dir, {"agent.": url, "master.": url})
        # Values at rest agree with kvctl stat (the master's copy is refreshed every tick).
        wait_for(lambda: parse_metrics(http_get(url)[1]).get("kvmaster_keys") == 3, "keys == 3")
        m = parse_metrics(http_get(url)[1])
        stat = self.p.stat(run_dir)
        self.assertEqual(m['kvagent_requests_total{op="put"}'], 3)
        self.assertEqual(m["kvagent_pool_written_bytes_total"], stat["agent.bytes_to_pool"][0])
        self.assertEqual(m["kvagent_pool_bytes"], 64 << 20)
        self.assertEqual(m["kvmaster_session_tags"], 1)
        self.assertEqual(m["kvagent_up"], 1)
        # The data plane's counters are exported too (computed by the TransferEngine).
        self.assertIn("kvagent_transfer_ok_ops_total", m)
        # Only /metrics is served.
        self.assertEqual(http_get(url.replace("/metrics", "/"))[0], 404)

    def test_agent_with_kvmaster(self):
        master = self.p.kvmaster("--metrics-listen", "127.0.0.1:0")
        self.assertIn("metrics", master)
        run_dir, _ = self.p.kvagent("a", "--metrics-listen", "127.0.0.1:0", master=master)
        self.assertEqual(self.p.kvctl(run_dir, "put", "k", "--value", "v").returncode, 0)
        url = self.p.stat(run_dir)["agent.metrics_endpoint"][1]
        self.check(run_dir, {"agent.": url, "master.": master["metrics"]})
        m = parse_metrics(http_get(url)[1])
        self.assertEqual(m["kvagent_master_link_up"], 1)
        self.assertEqual(m['kvagent_relay_phase_info{phase="live"}'], 1)
        # A remote agent does not repeat kvmaster's counters (scrape kvmaster for those).
        self.assertNotIn("kvmaster_keys", m)


class DashboardTest(unittest.TestCase):
    """Every metric the Grafana dashboard queries exists in a live scrape."""

    def test_dashboard_names_exist(self):
        p = Processes("kvagent-dashboard-")
        self.addCleanup(p.stop)
        master = p.kvmaster("--metrics-listen", "127.0.0.1:0")
        run_dir, _ = p.kvagent("a", "--metrics-listen", "127.0.0.1:0", master=master)
        url = p.stat(run_dir)["agent.metrics_endpoint"][1]
        families = set()
        for text in (http_get(url)[1], http_get(master["metrics"])[1]):
            families |= set(re.findall(r"^# TYPE (\w+) ", text, re.M))
        with open(os.environ["DASHBOARD_JSON"]) as f:
            dashboard = json.load(f)
        exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
        self.assertGreater(len(exprs), 10)
        for expr in exprs:
            for name in re.findall(r"\b(kv(?:agent|master)_\w+|process_\w+)", expr):
                family = re.sub(r"_(bucket|sum|count)$", "", name)
                self.assertIn(family, families, f"dashboard query {expr!r}")


class BadListenTest(unittest.TestCase):
    def setUp(self):
        self.p = Processes("kvagent-metrics-bad-")
        self.addCleanup(self.p.stop)

    def test_malformed_address_is_a_flag_error(self):
        for binary in ("KVAGENT", "KVMASTER"):
            r = subprocess.run([os.environ[binary], "--metrics-listen", "9478"],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("--metrics-listen: '9478' is not HOST:PORT", r.stderr)

    def test_taken_port_is_refused_by_name(self):
        master = self.p.kvmaster("--metrics-listen", "127.0.0.1:0")
        taken = master["metrics"].split("/")[2]  # 127.0.0.1:PORT
        run_dir = os.path.join(self.p.dir, "b")
        r = subprocess.run([os.environ["KVAGENT"], "--run-dir", run_dir, "--pool-size", "16MiB",
                            "--metrics-listen", taken], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot serve metrics on " + taken, r.stderr)


class SlowClientsTest(unittest.TestCase):
    """Idle and half-sent connections to a running agent's endpoint never hold a scrape off."""

    def test_idle_connections_do_not_hold_off_a_scrape(self):
        p = Processes("kvagent-metrics-slow-")
        self.addCleanup(p.stop)
        port = free_port()
        run_dir, _ = p.kvagent("a", "--metrics-listen", f"127.0.0.1:{port}")
        held = []
        self.addCleanup(lambda: [s.close() for s in held])
        for i in range(120):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i % 6 == 0:
                s.sendall(b"GET /metr")  # and the rest never
            held.append(s)
        # Answered within http_get's 5 s bound (one worker thread per connection took 10 s for
        # each idle connection ahead of the scrape).
        for _ in range(3):
            status, body = http_get(f"http://127.0.0.1:{port}/metrics")
            self.assertEqual(status, 200)
            self.assertEqual(parse_metrics(body)["kvagent_up"], 1)
        # At most the endpoint's 64 connections stay open: the oldest unfinished ones were closed
        # to make room, the later ones are still waiting (not timed out).
        readable, _, _ = select.select(held, [], [], 0)
        open_now = [s for s in held if s not in readable]
        self.assertLessEqual(len(open_now), 64)
        self.assertIn(held[-1], open_now)


class PrometheusTest(unittest.TestCase):
    """Debian's Prometheus server scrapes kvagent and kvmaster; its query API sees the puts."""

    def setUp(self):
        self.p = Processes("kvagent-prometheus-")
        self.addCleanup(self.p.stop)

    def query(self, web, promql):
        """The values of an instant query, {json labels: float}."""
        status, body = http_get(f"{web}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        if status != 200:
            return {}
        result = json.loads(body)["data"]["result"]
        return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in result}

    def test_prometheus_scrapes_agent_and_master(self):
        master = self.p.kvmaster("--metrics-listen", "127.0.0.1:0")
        agent_port = free_port()
        run_dir, _ = self.p.kvagent("a", "--metrics-listen", f"127.0.0.1:{agent_port}",
                                    master=master)
        values = [b"a" * 1000, b"b" * 2000, b"c" * 3000, b"d" * 4000]
        for i, v in enumerate(values):
            r = self.p.kvctl(run_dir, "put", f"key{i}", "--value", v.decode(), "--session",
                             f"s{i % 2}")
            self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.p.kvctl(run_dir, "get", "key1").returncode, 0)

        web_port = free_port()
        web = f"http://127.0.0.1:{web_port}"
        master_target = master["metrics"].split("/")[2]
        config = os.path.join(self.p.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: kvagent
    static_configs:
      - targets: ["127.0.0.1:{agent_port}"]
  - job_name: kvmaster
    static_configs:
      - targets: ["{master_target}"]
""")
        self.p.start([os.environ["PROMETHEUS"], f"--config.file={config}",
                      f"--storage.tsdb.path={os.path.join(self.p.dir, 'tsdb')}",
                      f"--web.listen-address=127.0.0.1:{web_port}", "--log.level=warn"],
                     "prometheus.log")
        wait_for(lambda: http_get(f"{web}/-/ready")[0] == 200, "Prometheus ready", 60)

        def single(promql, want):
            got = wait_for(lambda: (lambda v: v if v and list(v.values()) == [want] else None)(
                self.query(web, promql)), f"{promql} == {want}", 60)
            self.assertEqual(list(got.values()), [want])

        single('up{job="kvagent"}', 1.0)
        single('up{job="kvmaster"}', 1.0)
        single('kvagent_requests_total{job="kvagent",op="put"}', 4.0)
        single('kvagent_requests_total{job="kvagent",op="get"}', 1.0)
        single('kvagent_pool_written_bytes_total{job="kvagent"}', float(sum(map(len, values))))
        single('kvagent_pool_read_bytes_total{job="kvagent"}', 2000.0)
        single('kvmaster_keys{job="kvmaster"}', 4.0)
        single('kvmaster_session_tags{job="kvmaster"}', 2.0)
        single('kvmaster_agents{job="kvmaster"}', 1.0)
        # Phase histograms: every put and get went through each phase once (one key per batch).
        for phase in ("ring_wait", "master_start", "data", "master_end"):
            single(f'kvagent_put_phase_seconds_count{{job="kvagent",phase="{phase}"}}', 4.0)
        for phase in ("ring_wait", "master", "data"):
            single(f'kvagent_get_phase_seconds_count{{job="kvagent",phase="{phase}"}}', 1.0)
        q = self.query(web, 'histogram_quantile(0.5, kvagent_put_phase_seconds_bucket'
                            '{job="kvagent",phase="master_start"})')
        self.assertEqual(len(q), 1)
        self.assertGreater(list(q.values())[0], 0)


if __name__ == "__main__":
    unittest.main()
