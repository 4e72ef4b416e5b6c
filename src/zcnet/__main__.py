from zcnet.cli import main

raise SystemExit(main())
