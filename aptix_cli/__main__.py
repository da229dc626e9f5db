"""``python -m aptix_cli`` is ``aptix``."""

from aptix_cli.main import main

raise SystemExit(main())
