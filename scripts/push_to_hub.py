#!/usr/bin/env python
"""`vaswani-push`: build a model's Hub repository (a dry run with --output_dir) and upload it; see `--help`."""

import sys

from vaswani_transformer.hub import main


if __name__ == "__main__":
    sys.exit(main())
