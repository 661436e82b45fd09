"""Settings (environment, prefix ANVIL_) and the host config file (anvil.toml).

Both are built once at the edge (the CLI) and passed in; no library module reads
the environment itself. Validation errors name the file, the key and what was
expected. Every value is checked here, before anything runs: integers are
bounded, durations finite, URLs of a known scheme, text free of control and
bidi characters (`anvil_ctl.core.validate`). Files given by a person (this host
config, recipes, profiles, credential files) are read by `read_input_file`:
bytes, decoded as UTF-8, refused by name when they are a directory, a FIFO, a
symlink loop, too large or nested too deeply.

Modules: `inputs` (reading files), `fields` (field types), `settings` (the environment)
and `host` (anvil.toml).
"""
