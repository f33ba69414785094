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
MOONCAKE_TENANT_ID ("default"), MOONCAKE_OFFLOAD_ENABLED and
MOONCAKE_OFFLOAD_FILE_STORAGE_PATH (SSD offload: off, ""), MOONCAKE_ENABLE_CLIENT_HTTP_SERVER and
MOONCAKE_CLIENT_HTTP_PORT (off, 9300). Sizes take bytes or a number with KB/MB/GB/TB. Booleans
take true/false, 1/0, yes/no, on/off (and "enable"); anything else is a ValueError.

SSD offload, tenants and the client HTTP server are read so that a Mooncake configuration loads
with the values it says, and ``setup()`` then refuses them (kvagent has none of them) instead of
ignoring them.
"""
import dataclasses
import json
import logging
import os
from typing import Optional

from . import _setup

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB, Mooncake's default
DEFAULT_LOCAL_BUFFER_SIZE = 1 << 30

logger = logging.getLogger(__name__)

# Transport names Mooncake's engine knows; others are passed through with a warning.
KNOWN_PROTOCOLS = frozenset(("tcp", "rdma", "efa", "cxl", "ascend", "musa", "nvlink",
                             "nvlink_intra", "hip", "ub", "ubshmem", "maca", "sunrise_link",
                             "rpc_only", "nvmeof", "barex"))


def _parse_segment_size(value):
    """Bytes from an int or a size text ("512MB", "1.5gb", "4096"); ValueError otherwise."""
    return _size(value, "size")


_TRUE = ("true", "1", "yes", "on", "enable")
_FALSE = ("false", "0", "no", "off", "disable", "")


def _flag(value, what):
    """A boolean from a bool or a text; a text that is neither true nor false is refused."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("%s: %r is not a boolean (use true/false, 1/0, yes/no, on/off)"
                     % (what, value))


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
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self):
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError("Invalid protocol %r: give a transport name such as tcp or rdma"
                             % (self.protocol,))
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in KNOWN_PROTOCOLS:
            logger.warning("Unrecognised protocol %r, passed through as given (on kvagent the "
                           "node agent chooses the transport)", self.protocol)
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
            kvagent_run_dir=c.get("kvagent_run_dir") or os.environ.get(_setup.RUN_DIR_ENV),
            enable_ssd_offload=_flag(c.get("enable_ssd_offload", False), "enable_ssd_offload"),
            ssd_offload_path=str(c.get("ssd_offload_path") or ""),
            enable_client_http_server=_flag(c.get("enable_client_http_server", False),
                                            "enable_client_http_server"),
            client_http_port=int(c.get("client_http_port", 9300)))

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
            kvagent_run_dir=os.getenv(_setup.RUN_DIR_ENV),
            enable_ssd_offload=_flag(os.getenv("MOONCAKE_OFFLOAD_ENABLED", "false"),
                                     "MOONCAKE_OFFLOAD_ENABLED"),
            ssd_offload_path=os.getenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            enable_client_http_server=_flag(os.getenv("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER",
                                                      "false"),
                                            "MOONCAKE_ENABLE_CLIENT_HTTP_SERVER"),
            client_http_port=int(os.getenv("MOONCAKE_CLIENT_HTTP_PORT", 9300)))
