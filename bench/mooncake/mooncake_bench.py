#!/usr/bin/python3
"""mooncake_bench: the Mooncake-compatible package (mooncake.store on kvagent) as SGLang's
HiCache backend uses it, against its baselines measured in the same run on the same agent.

  mooncake.batch_put_from.128x64k.<memory>   GB/s   128 pages of 64 KiB from a registered buffer
  mooncake.batch_get_into.128x64k.<memory>   GB/s   the same pages back into a registered buffer
  <memory>: host_pool (allocated with MooncakeHostMemAllocator: kvagent shared memory, as
  SGLang's Mooncake allocator does) or plain_memory (any memory of the process: the agent
  copies it with process_vm_readv/writev).
  baselines: memcpy of the same 8 MiB into memory not in cache (a new slice of a 1 GiB region
  each round, as puts land in a pool; .vs_memcpy) and between hot buffers (.vs_memcpy_hot), and
  the native kvagent Python SDK (kvagent.Client.put/get with ArenaBuffers; .vs_native_sdk).
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
    from mooncake.store import MooncakeDistributedStore, MooncakeHostMemAllocator

    total = PAGES * PAGE
    gib = total / 1e9
    plain = (ctypes.c_ubyte * total)()  # ordinary memory of this process
    cold = (ctypes.c_ubyte * (1 << 30))()  # a pool-sized region for the memcpy baseline
    ctypes.memset(plain, 0x5A, total)  # touched: no page faults in the timed copies
    ctypes.memset(cold, 0, 1 << 30)
    src, cold_base = ctypes.addressof(plain), ctypes.addressof(cold)
    slices = (1 << 30) // total
    state = {"round": 0}

    def next_round():
        state["round"] += 1

    # Baselines: the copy a put cannot avoid, into memory not in cache (a new 8 MiB slice of a
    # 1 GiB region each round, as puts land in a pool), and the same copy between hot buffers.
    memcpy = median_seconds(next_round, lambda: ctypes.memmove(
        cold_base + (state["round"] % slices) * total, src, total))
    hot = (ctypes.c_ubyte * total)()
    memcpy_hot = median_seconds(lambda: None,
                                lambda: ctypes.memmove(ctypes.addressof(hot), src, total))
    del cold, hot
    bench("mooncake.memcpy.8MiB_to_cold", gib / memcpy, "GB/s")
    bench("mooncake.memcpy.8MiB_hot", gib / memcpy_hot, "GB/s")

    store = MooncakeDistributedStore()
    assert store.setup("localhost", "P2PHANDSHAKE", 1 << 30, 64 << 20, "tcp", "",
                       "127.0.0.1:50051") == 0
    allocator = MooncakeHostMemAllocator()
    pool = allocator.alloc(2 * total)  # an engine's host pool, as SGLang allocates it
    assert pool, "no host pool"
    ctypes.memset(pool, 0x5A, 2 * total)

    def keys_of(r):
        return ["bench-page-%d-%d" % (r, i) for i in range(PAGES)]

    def fresh():  # the previous round's pages go, so every put stores 128 new values
        store.remove_all(force=True)
        next_round()

    sizes = [PAGE] * PAGES
    figures = {}
    for name, base in (("host_pool", pool), ("plain_memory", src)):
        assert store.register_buffer(base, total) == 0
        ptrs = [base + i * PAGE for i in range(PAGES)]
        put = median_seconds(fresh, lambda: store.batch_put_from(keys_of(state["round"]),
                                                                 ptrs, sizes))
        readable = keys_of(state["round"] + 1)
        assert store.batch_put_from(readable, ptrs, sizes) == [0] * PAGES
        targets = [pool + total + i * PAGE for i in range(PAGES)] if base == pool else ptrs
        get = median_seconds(lambda: None, lambda: store.batch_get_into(readable, targets, sizes))
        assert store.batch_get_into(readable, targets, sizes) == sizes
        assert ctypes.string_at(targets[0], total) == b"\x5a" * total
        figures[name] = (put, get)

    native = kvagent.Client(run_dir=run, name="mooncake-bench-native", arena_bytes=64 << 20)
    values = [native.allocate(PAGE) for _ in range(PAGES)]
    for v in values:
        v.view()[:] = b"\x5a" * PAGE
    native_put = median_seconds(fresh, lambda: native.put(keys_of(state["round"]), values))
    native.put(keys_of(state["round"] + 1), values)
    native_keys = keys_of(state["round"] + 1)
    native_get = median_seconds(lambda: None, lambda: native.get(native_keys, values))
    bench("mooncake.native_sdk.put.128x64k", gib / native_put, "GB/s")
    bench("mooncake.native_sdk.get.128x64k", gib / native_get, "GB/s")

    for name, (put, get) in figures.items():
        for op, seconds, native_seconds in (("batch_put_from", put, native_put),
                                            ("batch_get_into", get, native_get)):
            prefix = "mooncake.%s.128x64k.%s" % (op, name)
            bench(prefix, gib / seconds, "GB/s")
            bench(prefix + ".vs_memcpy", memcpy / seconds, "ratio")
            bench(prefix + ".vs_memcpy_hot", memcpy_hot / seconds, "ratio")
            bench(prefix + ".vs_native_sdk", native_seconds / seconds, "ratio")

    one = keys_of(state["round"] + 1)[0]
    calls = 2000
    exist = median_seconds(lambda: None, lambda: [store.is_exist(one) for _ in range(calls)],
                           rounds=5)
    native_exist = median_seconds(lambda: None,
                                  lambda: [native.exist([one]) for _ in range(calls)], rounds=5)
    batch_keys = keys_of(state["round"] + 1)
    batch = median_seconds(lambda: None, lambda: [store.batch_is_exist(batch_keys)
                                                  for _ in range(calls // 20)], rounds=5)
    native_batch = median_seconds(lambda: None, lambda: [native.exist(batch_keys)
                                                         for _ in range(calls // 20)], rounds=5)
    bench("mooncake.is_exist", calls / exist, "keys/s")
    bench("mooncake.is_exist.vs_native_sdk", native_exist / exist, "ratio")
    bench("mooncake.batch_is_exist128", calls // 20 * PAGES / batch, "keys/s")
    bench("mooncake.batch_is_exist128.vs_native_sdk", native_batch / batch, "ratio")
    native.close()
    allocator.free(pool)
    store.close()


if __name__ == "__main__":
    main()
