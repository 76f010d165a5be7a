#!/usr/bin/env python
"""`vaswani-train-tokenizer`: train one shared source+target vocabulary and save it; see `--help`."""

import sys

from vaswani_transformer.tokenization import main


if __name__ == "__main__":
    sys.exit(main())
