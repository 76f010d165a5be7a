"""Train one shared source+target vocabulary (BPE by default, word-pieces as an option) and save it.

Plain text files (one sentence per line, both languages):

    python scripts/train_tokenizer.py --files ../shared/data/multi30k/train.en ../shared/data/multi30k/train.de \\
        --vocab-size 37000 --model bpe --output-dir outputs/tokenizer

Or any input `load_parallel_dataset` reads (a Hub dataset, a saved dataset, parallel text / TSV / JSON lines):

    python scripts/train_tokenizer.py --dataset_name wmt14 --dataset_config_name de-en \\
        --source_lang en --target_lang de --streaming --vocab-size 37000 --output-dir outputs/tokenizer_wmt14
    python scripts/train_tokenizer.py --train_file ../shared/data/multi30k/train --source_lang en --target_lang de \\
        --vocab-size 8000 --output-dir outputs/tokenizer_multi30k

The result loads with `AutoTokenizer.from_pretrained(output_dir)`.
"""

import argparse
import sys

from vaswani_transformer.tokenization import TOKENIZER_MODELS, count_lines, train_tokenizer


def run(args, parser):
    texts = length = None
    if args.dataset_name or args.train_file:
        from vaswani_transformer.data import iter_parallel_texts, load_parallel_dataset

        dataset = load_parallel_dataset(
            dataset_name=args.dataset_name,
            dataset_config_name=args.dataset_config_name,
            train_file=args.train_file,
            source_lang=args.source_lang,
            target_lang=args.target_lang,
            streaming=args.streaming,
        )
        if "train" not in dataset:
            parser.error(f"the dataset has no 'train' split (splits: {list(dataset)})")
        texts = iter_parallel_texts(dataset, args.source_lang, args.target_lang, split="train")
        if not args.streaming:  # for the progress bar
            length = 2 * len(dataset["train"]) + sum(count_lines(f) for f in args.files or ())
    return train_tokenizer(
        texts,
        files=args.files,
        vocab_size=args.vocab_size,
        model=args.model,
        min_frequency=args.min_frequency,
        length=length,
        show_progress=not args.no_progress,
        output_dir=args.output_dir,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", nargs="+", help="plain text files, one sentence per line")
    parser.add_argument("--dataset_name", "--dataset-name", help="Hub dataset name or a folder from save_to_disk")
    parser.add_argument("--dataset_config_name", "--dataset-config-name")
    parser.add_argument("--train_file", "--train-file", help="parallel prefix (path/train), .tsv or .jsonl")
    parser.add_argument("--source_lang", "--source-lang", default="en")
    parser.add_argument("--target_lang", "--target-lang", default="de")
    parser.add_argument("--streaming", action="store_true", help="read the dataset lazily")
    parser.add_argument("--vocab-size", "--vocab_size", type=int, default=37000)
    parser.add_argument("--model", choices=TOKENIZER_MODELS, default="bpe")
    parser.add_argument("--min-frequency", "--min_frequency", type=int, default=2)
    parser.add_argument("--output-dir", "--output_dir", required=True)
    parser.add_argument("--no-progress", "--no_progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)
    if not args.files and not args.dataset_name and not args.train_file:
        parser.error("give --files, --dataset_name or --train_file")

    try:
        tokenizer = run(args, parser)
    except (ValueError, FileNotFoundError) as err:  # bad input: a clear message, no traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"Saved a {args.model} tokenizer with {len(tokenizer)} tokens to {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
