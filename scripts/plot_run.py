#!/usr/bin/env python
"""Pictures of the model and of a training run (PNG); see `--help`.

    python scripts/plot_run.py encoding --d_model 512 --length 100 --output encoding.png
    python scripts/plot_run.py schedule configs/wmt14_en_de_base.yaml --output schedule.png
    python scripts/plot_run.py curves runs/quickstart --output curves.png

The library functions are in `vaswani_transformer.plots` (`main` is this command line).
"""

import sys

from vaswani_transformer.plots import main

if __name__ == "__main__":
    sys.exit(main())
