#!/usr/bin/env python
"""Table 3 at small scale: train chosen rows of the paper's Table 3 (presets), scaled down, for the same budget and
seed on a recipe's data, and print dev perplexity and BLEU in the paper's layout; see `--help`.

    python scripts/ablations.py configs/multi30k_cpu.yaml --rows base A-h1 B-dk16 C-N2 D-ls0.0 E-learned \
        --scale_factor 4 --max_steps 500 --seed 1 --num_beams 1 --output_dir runs/table3

The runner is `vaswani_transformer.ablations` (`run_ablations`, `main`).
"""

import sys

from vaswani_transformer.ablations import main

if __name__ == "__main__":
    sys.exit(main())
