from anvil_ctl.cli import main

raise SystemExit(main())
