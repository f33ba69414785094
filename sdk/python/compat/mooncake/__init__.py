"""``mooncake`` on kvagent: a drop-in for the Python package of Mooncake Store, so that engines
written against ``mooncake.store.MooncakeDistributedStore`` (SGLang HiCache, LMCache, vLLM's
Mooncake connectors) store their KV cache in kvagent with no code change.

Put ``sdk/python/compat`` on PYTHONPATH (ahead of any installed Mooncake) and point the
engine at the node's agent with KVAGENT_RUN_DIR (default /run/kvagent). It needs only the
``kvagent`` package (``sdk/python``), found on the path or next to this folder, and
libkvclient.so (``make build``). See docs/sdk.md, "Mooncake compatibility".
"""
import os
import sys

try:
    import kvagent  # noqa: F401
except ImportError:  # used from the source tree: the kvagent package sits two folders up
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import kvagent  # noqa: F401

KVAGENT_COMPAT = True  # tells callers (and tests) this is kvagent's package, not Mooncake's
