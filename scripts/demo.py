#!/usr/bin/env python
"""Build a model from a paper preset, save it, reload it with AutoModelForSeq2SeqLM and generate; see `--help`.

    python scripts/demo.py --preset base --output_dir outputs/demo
"""

from vaswani_transformer.demo import main


if __name__ == "__main__":
    main()
