"""`python -m workers` starts the GPU host agent (see workers.agent)."""

import sys

from workers.agent import main

sys.exit(main())
