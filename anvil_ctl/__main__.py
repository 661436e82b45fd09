from anvil_ctl.cli import console

console()
