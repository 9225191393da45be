"""`make serve`'s automations step: relaunch.cli.automations, run from a checkout (see its docstring)."""

import sys

from relaunch.cli.automations import main

if __name__ == "__main__":
    sys.exit(main())
