#!/usr/bin/python3
"""Python half of sdk_c_bench: kvagent.Client calls and bare ctypes calls as their floor.

Usage: sdk_python_bench.py <agent run dir> (KVAGENT_LIBKVCLIENT and PYTHONPATH set by the
caller). Prints BENCH lines: microseconds per call.
"""
import ctypes
import statistics
import sys
import time

import kvagent
from kvagent import _native

CALLS = 5000


def median_us(op, calls=CALLS, chunk=500):
    """The lowest median of chunks of ``chunk`` calls (as BestChunkMedianMicros in
    sdk_c_bench.cc: the agent is sometimes descheduled for whole stretches here)."""
    for _ in range(calls // 10):
        op()
    best = float("inf")
    for _ in range(max(1, calls // chunk)):
        samples = []
        for _ in range(chunk):
            start = time.perf_counter()
            op()
            samples.append((time.perf_counter() - start) * 1e6)
        best = min(best, statistics.median(samples))
    return best


def bench(name, value):
    print("BENCH %s %.3f us" % (name, value), flush=True)


def main():
    client = kvagent.Client(run_dir=sys.argv[1], name="sdk-python-bench", arena_bytes=4 << 20)
    lib = _native.library()
    handle = client._handle
    keys = ["bench-key-%d" % (1000000000 + i) for i in range(64)]  # stored by sdk_c_bench
    bench("sdk.ping.ctypes_raw", median_us(lambda: lib.kv_ping(handle, 0)))
    bench("sdk.ping.python", median_us(client.ping))

    def exist():
        client.exist(keys)

    bench("sdk.exist64.python", median_us(exist, CALLS // 4))
    buffers = [client.allocate(4096) for _ in keys]
    bench("sdk.get64x4k.python", median_us(lambda: client.get(keys, buffers), CALLS // 4))

    encoded = [k.encode() for k in keys]
    c_keys = (_native.Bytes * len(keys))(
        *[_native.Bytes(ctypes.cast(ctypes.c_char_p(k), ctypes.c_void_p), len(k))
          for k in encoded])
    out = ctypes.POINTER(_native.Result)()

    def exist_raw():
        lib.kv_exist(handle, len(keys), c_keys, None, ctypes.byref(out))
        lib.kv_result_free(out)

    bench("sdk.exist64.ctypes_raw", median_us(exist_raw, CALLS // 4))
    client.close()


if __name__ == "__main__":
    main()
