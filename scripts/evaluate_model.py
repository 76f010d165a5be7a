#!/usr/bin/env python
"""`vaswani-evaluate`: translate a test set (or take given translations) and report BLEU as JSON; see `--help`."""

import sys

from vaswani_transformer.evaluation import main


if __name__ == "__main__":
    sys.exit(main())
