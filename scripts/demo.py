"""Build a model from a paper preset, save it, reload it with AutoModelForSeq2SeqLM and generate.

    python scripts/demo.py --preset base --output-dir outputs/demo
"""

import argparse

from vaswani_transformer.demo import run_demo


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="base", help="a paper preset (see vaswani_transformer.available_presets())")
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--output-dir", default="outputs/demo")
    args = parser.parse_args()
    print(run_demo(args.preset, args.output_dir, vocab_size=args.vocab_size))


if __name__ == "__main__":
    main()
