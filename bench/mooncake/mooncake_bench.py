#!/usr/bin/python3
"""mooncake_bench: the Mooncake-compatible package (mooncake.store on kvagent) as SGLang's
HiCache backend uses it, against its baselines measured in the same run on the same agent.

  mooncake.batch_put_from.128x64k      GB/s   128 pages of 64 KiB from a registered buffer
  mooncake.batch_get_into.128x64k      GB/s   the same pages back into a registered buffer
  baselines: memcpy of the same 8 MiB (ctypes.memmove, one copy in this process) and the
  native kvagent Python SDK (kvagent.Client.put/get with ArenaBuffers, the zero-copy path)
  mooncake.is_exist / batch_is_exist128 keys/s, against kvagent.Client.exist of one key / 128.

Usage: mooncake_bench.py [BUILD_DIR] (default build/); starts its own kvagent. Prints
`BENCH <name> <value> <unit>` lines (each a median over repeated rounds).
"""
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(REPO, "sdk", "python", "compat"), os.path.join(REPO, "sdk", "python")]

PAGES, PAGE = 128, 64 << 10
ROUNDS = 30


def bench(name, value, unit):
    print("BENCH %s %.3f %s" % (name, value, unit), flush=True)


def median_seconds(setup, op, rounds=ROUNDS):
    """The median time of op() over ``rounds`` rounds, each after an untimed setup()."""
    samples = []
    for _ in range(rounds):
        setup()
        start = time.perf_counter()
        op()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def start_agent(build):
    run = tempfile.mkdtemp(prefix="mooncake-bench-")
    agent = subprocess.Popen([os.path.join(build, "agent", "kvagent"), "--run-dir", run,
                              "--pool-size", "1GiB"], stderr=subprocess.DEVNULL)
    kvctl = os.path.join(build, "tools", "kvctl")
    subprocess.run([kvctl, "--run-dir", run, "ping", "--wait-ms", "60000"], check=True,
                   stdout=subprocess.DEVNULL)
    return agent, run


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "build"))
    os.environ.setdefault("KVAGENT_LIBKVCLIENT", os.path.join(build, "sdk", "c",
                                                              "libkvclient.so.0"))
    agent, run = start_agent(build)
    try:
        os.environ["KVAGENT_RUN_DIR"] = run
        measure(run)
    finally:
        agent.kill()
        agent.wait()
        shutil.rmtree(run, ignore_errors=True)


def measure(run):
    import kvagent
    from mooncake.store import MooncakeDistributedStore

    total = PAGES * PAGE
    gib = total / 1e9
    source = (ctypes.c_ubyte * total)()
    target = (ctypes.c_ubyte * total)()
    ctypes.memset(source, 0x5A, total)  # touched: no page faults in the timed copies
    ctypes.memset(target, 0, total)
    src, dst = ctypes.addressof(source), ctypes.addressof(target)

    memcpy = median_seconds(lambda: None, lambda: ctypes.memmove(dst, src, total))
    bench("mooncake.memcpy.8MiB", gib / memcpy, "GB/s")

    store = MooncakeDistributedStore()
    assert store.setup("localhost", "P2PHANDSHAKE", 1 << 30, 64 << 20, "tcp", "",
                       "127.0.0.1:50051") == 0
    assert store.register_buffer(src, total) == 0 and store.register_buffer(dst, total) == 0
    ptrs = [src + i * PAGE for i in range(PAGES)]
    dptrs = [dst + i * PAGE for i in range(PAGES)]
    sizes = [PAGE] * PAGES
    state = {"round": 0}

    def keys_of(r):
        return ["bench-page-%d-%d" % (r, i) for i in range(PAGES)]

    def fresh():  # the previous round's pages go, so every put stores 128 new values
        store.remove_all(force=True)
        state["round"] += 1

    put = median_seconds(fresh, lambda: store.batch_put_from(keys_of(state["round"]), ptrs,
                                                             sizes))
    codes = store.batch_put_from(keys_of(state["round"] + 1), ptrs, sizes)
    assert codes == [0] * PAGES, codes
    readable = keys_of(state["round"] + 1)
    get = median_seconds(lambda: None, lambda: store.batch_get_into(readable, dptrs, sizes))
    assert store.batch_get_into(readable, dptrs, sizes) == sizes
    assert ctypes.string_at(dst, total) == ctypes.string_at(src, total)

    native = kvagent.Client(run_dir=run, name="mooncake-bench-native", arena_bytes=64 << 20)
    values = [native.allocate(PAGE) for _ in range(PAGES)]
    for v in values:
        v.view()[:] = b"\x5a" * PAGE
    native_put = median_seconds(fresh, lambda: native.put(keys_of(state["round"]), values))
    native.put(keys_of(state["round"] + 1), values)
    native_keys = keys_of(state["round"] + 1)
    native_get = median_seconds(lambda: None, lambda: native.get(native_keys, values))

    bench("mooncake.batch_put_from.128x64k", gib / put, "GB/s")
    bench("mooncake.batch_put_from.128x64k.vs_memcpy", memcpy / put, "ratio")
    bench("mooncake.batch_put_from.128x64k.vs_native_sdk", native_put / put, "ratio")
    bench("mooncake.native_sdk.put.128x64k", gib / native_put, "GB/s")
    bench("mooncake.batch_get_into.128x64k", gib / get, "GB/s")
    bench("mooncake.batch_get_into.128x64k.vs_memcpy", memcpy / get, "ratio")
    bench("mooncake.batch_get_into.128x64k.vs_native_sdk", native_get / get, "ratio")
    bench("mooncake.native_sdk.get.128x64k", gib / native_get, "GB/s")

    one = readable[0]
    calls = 2000
    exist = median_seconds(lambda: None, lambda: [store.is_exist(one) for _ in range(calls)],
                           rounds=5)
    native_exist = median_seconds(lambda: None,
                                  lambda: [native.exist([one]) for _ in range(calls)], rounds=5)
    batch = median_seconds(lambda: None, lambda: [store.batch_is_exist(readable)
                                                  for _ in range(calls // 20)], rounds=5)
    native_batch = median_seconds(lambda: None, lambda: [native.exist(readable)
                                                         for _ in range(calls // 20)], rounds=5)
    bench("mooncake.is_exist", calls / exist, "keys/s")
    bench("mooncake.is_exist.vs_native_sdk", native_exist / exist, "ratio")
    bench("mooncake.batch_is_exist128", calls // 20 * PAGES / batch, "keys/s")
    bench("mooncake.batch_is_exist128.vs_native_sdk", native_batch / batch, "ratio")
    native.close()
    store.close()


if __name__ == "__main__":
    main()
