"""MooncakeDistributedStore.setup's arguments: the positional/keyword form, the dict form,
and (an extension) no arguments at all, which reads MOONCAKE_CONFIG_PATH / MOONCAKE_* like
``mooncake.mooncake_config.MooncakeConfig.load_from_env``.

In kvagent the node agent owns the memory pool, the transport and the link to the master, so
most of Mooncake's settings are hints: the compat connects to the local agent (run directory
from KVAGENT_RUN_DIR, default /run/kvagent) and uses ``local_buffer_size`` to size its
shared-memory arena (at least 64 MiB). Settings kvagent cannot honour are refused rather than
ignored: as keyword arguments they raise TypeError naming the keyword (callers such as SGLang
retry without it), as dict entries they make setup return -600.
"""
import os

from . import _codes

DEFAULT_RUN_DIR = "/run/kvagent"
RUN_DIR_ENV = "KVAGENT_RUN_DIR"
MIN_ARENA_BYTES = 64 << 20
MIN_SEGMENT_SIZE = 1024
MAX_SEGMENT_SIZE = 1 << 40

# Mooncake's setup() keywords after the seven positional ones, with their defaults. kvagent
# supports `engine` (ignored: the agent owns the transport) and the default of each other one.
_OPTIONAL_DEFAULTS = {
    "engine": None,
    "enable_ssd_offload": False,
    "ssd_offload_path": "",
    "tenant_id": "default",
    "enable_client_http_server": False,
    "client_http_port": 9300,
}
_WHY_UNSUPPORTED = {
    "enable_ssd_offload": "kvagent has no SSD offload",
    "ssd_offload_path": "kvagent has no SSD offload",
    "tenant_id": "kvagent has one key space per cluster (no tenants)",
    "enable_client_http_server": "kvagent serves its counters through `kvctl stat`, not HTTP",
    "client_http_port": "kvagent serves its counters through `kvctl stat`, not HTTP",
}
_POSITIONAL = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
               "protocol", "rdma_devices", "master_server_addr")


class Settings:
    """What setup() resolved: where the agent is and how large an arena to ask for."""

    __slots__ = ("local_hostname", "run_dir", "arena_bytes", "hints")

    def __init__(self, local_hostname, run_dir, arena_bytes, hints):
        self.local_hostname = local_hostname
        self.run_dir = run_dir
        self.arena_bytes = arena_bytes
        self.hints = hints  # Mooncake settings kvagent does not use, for the log


class Refused(ValueError):
    """setup() must return ``code`` (a Mooncake error code) with this message logged."""

    def __init__(self, message, code=_codes.INVALID_PARAMS):
        super().__init__(message)
        self.code = code


def parse_size(text, what):
    """A Mooncake size string ("16MB", "1.5 GB", "1048576", "infinite") as bytes; raises
    Refused for anything else (percentages, negative numbers, unknown units)."""
    s = str(text).strip()
    if s == "infinite":
        return (1 << 64) - 1
    number_end = len(s)
    for i, ch in enumerate(s):
        if not (ch.isdigit() or ch in ".+-eE"):
            number_end = i
            break
    try:
        value = float(s[:number_end])
    except ValueError:
        raise Refused("%s %r is not a size; give bytes or a number with KB/MB/GB/TB"
                      % (what, text)) from None
    unit = s[number_end:].strip().upper()
    scale = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
             "G": 1 << 30, "GB": 1 << 30, "T": 1 << 40, "TB": 1 << 40}.get(unit)
    if scale is None or value < 0:
        raise Refused("%s %r is not a size; give bytes or a number with KB/MB/GB/TB"
                      % (what, text))
    return int(value * scale)


def default_run_dir():
    """KVAGENT_RUN_DIR, or /run/kvagent."""
    return os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR


def _run_dir(explicit=None):
    return explicit or default_run_dir()


def _settings(local_hostname, global_segment_size, local_buffer_size, protocol, rdma_devices,
              master_server_addr, metadata_server, run_dir=None):
    if not local_hostname:
        raise Refused("local_hostname is empty; give this node's name")
    if global_segment_size != 0 and global_segment_size < MIN_SEGMENT_SIZE:
        raise Refused("global_segment_size %d is below 1 KiB" % global_segment_size)
    if local_buffer_size != 0 and not MIN_SEGMENT_SIZE <= local_buffer_size <= MAX_SEGMENT_SIZE:
        raise Refused("local_buffer_size %d is outside 1 KiB .. 1 TiB" % local_buffer_size)
    hints = {"metadata_server": metadata_server, "global_segment_size": global_segment_size,
             "protocol": protocol, "rdma_devices": rdma_devices,
             "master_server_addr": master_server_addr}
    return Settings(str(local_hostname), _run_dir(run_dir),
                    max(MIN_ARENA_BYTES, local_buffer_size), hints)


def from_arguments(args, kwargs):
    """Settings for setup(local_hostname, metadata_server, global_segment_size,
    local_buffer_size, protocol, rdma_devices, master_server_addr, engine=None, ...).
    Raises TypeError for arguments the binding would refuse or kvagent cannot honour."""
    names = _POSITIONAL + tuple(_OPTIONAL_DEFAULTS)
    if len(args) > len(names):
        raise TypeError("setup() takes at most %d arguments (%d given)" % (len(names), len(args)))
    values = dict(zip(names, args))
    for name, value in kwargs.items():
        if name not in names:
            raise TypeError("setup() got an unexpected keyword argument '%s'" % name)
        if name in values:
            raise TypeError("setup() got multiple values for argument '%s'" % name)
        values[name] = value
    missing = [n for n in _POSITIONAL if n not in values]
    if missing:
        raise TypeError("setup() missing required argument(s): %s" % ", ".join(missing))
    for name, default in _OPTIONAL_DEFAULTS.items():
        if name in _WHY_UNSUPPORTED and name in values and values[name] != default:
            raise TypeError("setup() got an unsupported keyword argument '%s' (%s); retry "
                            "without it" % (name, _WHY_UNSUPPORTED[name]))
    for name in ("local_hostname", "metadata_server", "protocol", "rdma_devices",
                 "master_server_addr"):
        if not isinstance(values[name], str):
            raise TypeError("setup(): %s must be a str, got %s"
                            % (name, type(values[name]).__name__))
    for name in ("global_segment_size", "local_buffer_size"):
        v = values[name]
        if type(v) is bool or not isinstance(v, int) or v < 0:
            raise TypeError("setup(): %s must be an int >= 0 (bytes), got %r" % (name, v))
    return _settings(values["local_hostname"], values["global_segment_size"],
                     values["local_buffer_size"], values["protocol"], values["rdma_devices"],
                     values["master_server_addr"], values["metadata_server"])


def _bool(text):
    return str(text).strip().lower() in ("1", "true", "yes", "on", "enable")


def from_dict(config):
    """Settings for setup(config_dict), read as Mooncake reads it (every value as text; unknown
    keys ignored). Raises Refused for a missing or bad value or a setting kvagent cannot
    honour. The extra key ``kvagent_run_dir`` names the agent's run directory."""
    c = {str(k): v for k, v in config.items()}
    for required in ("local_hostname", "metadata_server"):
        if not str(c.get(required, "")):
            raise Refused("setup(config): %s is required" % required)
    if _bool(c.get("enable_ssd_offload", "false")) or str(c.get("ssd_offload_path", "")):
        raise Refused("setup(config): " + _WHY_UNSUPPORTED["enable_ssd_offload"])
    if str(c.get("tenant_id", "default")) != "default":
        raise Refused("setup(config): " + _WHY_UNSUPPORTED["tenant_id"])
    if _bool(c.get("enable_client_http_server", "false")):
        raise Refused("setup(config): " + _WHY_UNSUPPORTED["enable_client_http_server"])
    return _settings(str(c["local_hostname"]),
                     parse_size(c.get("global_segment_size", 16 << 20), "global_segment_size"),
                     parse_size(c.get("local_buffer_size", 16 << 20), "local_buffer_size"),
                     str(c.get("protocol", "tcp")), str(c.get("rdma_devices", "")),
                     str(c.get("master_server_addr", "127.0.0.1:50051")),
                     str(c["metadata_server"]), c.get("kvagent_run_dir"))


def from_environment():
    """Settings for setup() without arguments: MOONCAKE_CONFIG_PATH (JSON), else the MOONCAKE_*
    variables (see mooncake.mooncake_config)."""
    from .mooncake_config import MooncakeConfig
    try:
        mc = MooncakeConfig.load_from_env()
    except (OSError, ValueError) as e:
        raise Refused("setup(): no usable Mooncake configuration (%s)" % e) from None
    if mc.tenant_id != "default":
        raise Refused("setup(): " + _WHY_UNSUPPORTED["tenant_id"])
    if mc.enable_ssd_offload or mc.ssd_offload_path:
        raise Refused("setup(): " + _WHY_UNSUPPORTED["enable_ssd_offload"])
    if mc.enable_client_http_server:
        raise Refused("setup(): " + _WHY_UNSUPPORTED["enable_client_http_server"])
    return _settings(mc.local_hostname, mc.global_segment_size, mc.local_buffer_size,
                     mc.protocol, mc.device_name or "", mc.master_server_address,
                     mc.metadata_server, mc.kvagent_run_dir)
