#!/usr/bin/env python
"""Django's command-line utility for administrative tasks (memoryhub/cli.py: beside `make run`,
failing in one line when the database or Redis cannot be reached)."""

import sys

from memoryhub.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv))
