"""``python -m agentrl.cli`` is ``agentrl``."""

import sys

from agentrl.cli import main

sys.exit(main())
