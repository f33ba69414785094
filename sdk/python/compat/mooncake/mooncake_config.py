"""``mooncake.mooncake_config``: the Mooncake client configuration, read from a JSON file
(MOONCAKE_CONFIG_PATH) or from MOONCAKE_* environment variables, with Mooncake's names and
defaults.

On kvagent these settings are hints (the node agent owns the pool, the transport and the
master link); ``MooncakeDistributedStore.setup()`` called without arguments uses this to find
``local_hostname`` and the arena size. One addition: ``kvagent_run_dir`` (JSON key, or the
KVAGENT_RUN_DIR variable) names the agent's run directory (default /run/kvagent).

Environment variables: MOONCAKE_CONFIG_PATH (a JSON file; wins when set), MOONCAKE_MASTER
(required without a file), MOONCAKE_LOCAL_HOSTNAME ("localhost"),
MOONCAKE_TE_META_DATA_SERVER ("P2PHANDSHAKE"), MOONCAKE_GLOBAL_SEGMENT_SIZE (3.125 GiB),
MOONCAKE_LOCAL_BUFFER_SIZE (1 GiB), MOONCAKE_PROTOCOL ("tcp"), MOONCAKE_DEVICE (""),
MOONCAKE_TENANT_ID ("default"). Sizes take bytes or a number with KB/MB/GB/TB.
"""
import dataclasses
import json
import os
from typing import Optional

from . import _setup

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB, Mooncake's default
DEFAULT_LOCAL_BUFFER_SIZE = 1 << 30


def _size(value, what):
    try:
        return _setup.parse_size(value, what)
    except _setup.Refused as e:
        raise ValueError(str(e)) from None


@dataclasses.dataclass
class MooncakeConfig:
    """One client's Mooncake settings (the fields of Mooncake's MooncakeConfig)."""

    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: Optional[str]
    master_server_address: str
    tenant_id: str = "default"
    kvagent_run_dir: Optional[str] = None

    def __post_init__(self):
        self.protocol = (self.protocol or "tcp").strip().lower()
        for name in ("local_hostname", "metadata_server", "master_server_address"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError("config field %r must be a non-empty string, got %r"
                                 % (name, value))
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError("%s must be >= 0" % name)

    @staticmethod
    def from_file(file_path):
        """Reads a JSON file with local_hostname, metadata_server, master_server_address
        (required) and global_segment_size, local_buffer_size, protocol, device_name,
        tenant_id, kvagent_run_dir (optional)."""
        with open(file_path) as f:
            c = json.load(f)
        for required in ("local_hostname", "metadata_server", "master_server_address"):
            if required not in c:
                raise ValueError("%s: missing required config field %s" % (file_path, required))
        return MooncakeConfig(
            local_hostname=c["local_hostname"],
            metadata_server=c["metadata_server"],
            global_segment_size=_size(c.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE),
                                      "global_segment_size"),
            local_buffer_size=_size(c.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE),
                                    "local_buffer_size"),
            protocol=c.get("protocol", "tcp"),
            device_name=c.get("device_name", ""),
            master_server_address=c["master_server_address"],
            tenant_id=str(c.get("tenant_id") or "default"),
            kvagent_run_dir=c.get("kvagent_run_dir") or os.environ.get(_setup.RUN_DIR_ENV))

    @staticmethod
    def load_from_env():
        """MOONCAKE_CONFIG_PATH's file when set, else the MOONCAKE_* variables."""
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path:
            return MooncakeConfig.from_file(path)
        if not os.getenv("MOONCAKE_MASTER"):
            raise ValueError("neither MOONCAKE_CONFIG_PATH nor MOONCAKE_MASTER is set")
        return MooncakeConfig(
            local_hostname=os.getenv("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=os.getenv("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=_size(os.getenv("MOONCAKE_GLOBAL_SEGMENT_SIZE",
                                                DEFAULT_GLOBAL_SEGMENT_SIZE),
                                      "MOONCAKE_GLOBAL_SEGMENT_SIZE"),
            local_buffer_size=_size(os.getenv("MOONCAKE_LOCAL_BUFFER_SIZE",
                                              DEFAULT_LOCAL_BUFFER_SIZE),
                                    "MOONCAKE_LOCAL_BUFFER_SIZE"),
            protocol=os.getenv("MOONCAKE_PROTOCOL", "tcp"),
            device_name=os.getenv("MOONCAKE_DEVICE", ""),
            master_server_address=os.getenv("MOONCAKE_MASTER"),
            tenant_id=os.getenv("MOONCAKE_TENANT_ID", "default"),
            kvagent_run_dir=os.getenv(_setup.RUN_DIR_ENV))
