#!/usr/bin/env python
"""Average the last K checkpoints of a training run into a model folder that `from_pretrained` loads.

Paper (Section 6.1): the base models average the last 5 checkpoints, the big models the last 20.

    python scripts/average_checkpoints.py runs/base --num-last 5 --output-dir runs/base/averaged
    python scripts/average_checkpoints.py runs/base/checkpoint-90000 runs/base/checkpoint-100000 --output-dir avg

Incomplete checkpoints (no model.safetensors or trainer_state.json, or a file that does not load: a safetensors
file cut short, JSON that does not parse, a torch archive cut short) are skipped with a warning naming the file;
fewer valid checkpoints than --num-last is an error. See `vaswani_transformer.averaging.average_checkpoints`.
"""

import argparse
import json
import sys

from vaswani_transformer.averaging import average_checkpoints


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "checkpoints", nargs="+",
        help="A run directory holding checkpoint-<step> folders, or several checkpoint folders.",
    )
    parser.add_argument(
        "--num-last", "--num_last", type=int, default=5,
        help="Number of newest valid checkpoints to average (default 5; paper: 5 base, 20 big; 0 = all).",
    )
    parser.add_argument("--output-dir", "--output_dir", required=True, help="Folder for the averaged model.")
    args = parser.parse_args(argv)
    if args.num_last < 0:
        parser.error(f"--num-last must be >= 0, got {args.num_last}.")

    source = args.checkpoints[0] if len(args.checkpoints) == 1 else args.checkpoints
    try:
        result = average_checkpoints(source, num_last=args.num_last or None, output_dir=args.output_dir)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"Averaged {len(result.checkpoints)} checkpoints into {result.output_dir}:")
    print(json.dumps(result.to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
