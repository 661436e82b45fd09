"""Settings (environment, prefix ANVIL_) and the host config file (anvil.toml).

Both are built once at the edge (the CLI) and passed in; no library module reads
the environment itself. Validation errors name the file, the key and what was
expected. Every value is checked here, before anything runs: integers are
bounded, durations finite, URLs of a known scheme, text free of control and
bidi characters (`anvil_ctl.core.validate`). Files given by a person (this host
config, recipes, profiles, credential files) are read by `read_input_file`:
bytes, decoded as UTF-8, refused by name when they are a directory, a FIFO, a
symlink loop, too large or nested too deeply.

This package re-exports its modules' public names, so `from anvil_ctl.config import X`
holds whichever module X lives in: `inputs` (reading files), `fields` (field types),
`settings` (the environment) and `host` (anvil.toml).
"""

from anvil_ctl.config.fields import (
    ENV_NAME_RE,
    GPU_UUID_RE,
    NAME_RE,
    STATE_DB_RE,
    Duration,
    FilePath,
    HttpUrl,
    Label,
    MiB,
)
from anvil_ctl.config.host import (
    ENGINE_SEGMENTS,
    GpuRole,
    HostConfig,
    Policy,
    ResidueConfig,
    RouterConfig,
    Slot,
    load_host_config,
    machine_host_name,
)
from anvil_ctl.config.inputs import (
    MAX_INPUT_BYTES,
    MAX_NESTING,
    decode_utf8,
    format_validation_error,
    load_toml,
    parse_toml,
    read_input_file,
)
from anvil_ctl.config.settings import SETTING_VARIABLES, Settings, setting_origins

__all__ = [
    "ENGINE_SEGMENTS",
    "ENV_NAME_RE",
    "GPU_UUID_RE",
    "MAX_INPUT_BYTES",
    "MAX_NESTING",
    "NAME_RE",
    "SETTING_VARIABLES",
    "STATE_DB_RE",
    "Duration",
    "FilePath",
    "GpuRole",
    "HostConfig",
    "HttpUrl",
    "Label",
    "MiB",
    "Policy",
    "ResidueConfig",
    "RouterConfig",
    "Settings",
    "Slot",
    "decode_utf8",
    "format_validation_error",
    "load_host_config",
    "load_toml",
    "machine_host_name",
    "parse_toml",
    "read_input_file",
    "setting_origins",
]
