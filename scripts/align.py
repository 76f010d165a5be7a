#!/usr/bin/env python
"""Word alignments (Pharaoh format) from cross-attention, over a source file and its translations; see `--help`."""

import sys

from vaswani_transformer.attention import align_main


if __name__ == "__main__":
    sys.exit(align_main())
