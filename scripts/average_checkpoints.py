#!/usr/bin/env python
"""Average the last K checkpoints of a training run into a model folder that `from_pretrained` loads; see `--help`.

    python scripts/average_checkpoints.py runs/base --num_last 5 --output_dir runs/base/averaged

The same command is installed as `vaswani-average` (`vaswani_transformer.checkpoints.main`).
"""

import sys

from vaswani_transformer.checkpoints import main

if __name__ == "__main__":
    sys.exit(main())
