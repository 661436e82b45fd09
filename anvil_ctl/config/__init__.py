"""Settings (environment, prefix ANVIL_) and the host config file (anvil.toml): both built once
at the edge and passed in; errors name the file, the key and what was expected."""
