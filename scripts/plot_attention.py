#!/usr/bin/env python
"""Attention pictures of one sentence (heat maps, all heads of a layer, Figures 3-5, an HTML page); see `--help`."""

import sys

from vaswani_transformer.attention import plot_attention_main


if __name__ == "__main__":
    sys.exit(plot_attention_main())
