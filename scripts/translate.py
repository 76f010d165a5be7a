#!/usr/bin/env python
"""`vaswani-translate`: translate a text file (or stdin) line for line; `--help` lists the options."""

import sys

from vaswani_transformer.translate import main


if __name__ == "__main__":
    sys.exit(main())
