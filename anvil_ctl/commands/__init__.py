"""The library of commands: plain functions returning result values; the CLI renders them."""
