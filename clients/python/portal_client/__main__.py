"""`python -m portal_client ...` is `gpu-portal ...`."""

from portal_client.cli import main

raise SystemExit(main())
