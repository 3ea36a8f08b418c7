"""``python -m envrun.cli``: the envrun command."""

import sys

from envrun.cli.main import main

sys.exit(main())
