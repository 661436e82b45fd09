"""Settings (environment, prefix ANVIL_) and the host config file (anvil.toml).

Both are built once at the edge (the CLI) and passed in; no library module reads the
environment itself. Every value is checked here before anything runs, and an error names
the file, the key and what was expected. Files a person gives (host config, recipes,
profiles, credential files) are read by `inputs.read_input_file`, which refuses by name a
directory, a FIFO, a symlink loop, a file too large or nested too deeply.
"""
