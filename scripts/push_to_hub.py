#!/usr/bin/env python
"""Build the Hub repository of a trained model (weights, code, tokenizer, generation config, model card) and upload it.

Dry run (writes the folder, uploads nothing):

    python scripts/push_to_hub.py --model outputs/run/averaged --source-lang en --target-lang de \
        --eval-results outputs/run/eval_test.json --dataset bentrevett/multi30k --output-dir outputs/hub-en-de

Upload (token from `hf auth login` or HF_TOKEN; never printed):

    python scripts/push_to_hub.py --model outputs/run/averaged --repo-id me/transformer-base-en-de --private

Before any upload the folder is loaded in a fresh Python where `vaswani_transformer` cannot be imported
(`trust_remote_code=True`) and must translate a sentence; otherwise nothing is uploaded. See
`vaswani_transformer.hub`.
"""

import argparse
import json
import logging
import sys
import tempfile

from vaswani_transformer.hub import (
    RepositoryValidationError,
    export_repository,
    push_repository,
    training_info_from_run,
    validate_repository,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", "--model_name_or_path", required=True, help="Saved model folder (with its tokenizer)."
    )
    parser.add_argument(
        "--output-dir", "--output_dir", default=None, help="Dry run: write the repository folder here, upload nothing."
    )
    parser.add_argument("--overwrite", action="store_true", help="Replace a non-empty --output-dir.")
    parser.add_argument(
        "--repo-id",
        "--repo_id",
        default=None,
        help="Hub repository, owner/name: uploads there (with --output-dir it only names the card).",
    )
    parser.add_argument("--private", action="store_true", help="Create the repository private.")
    parser.add_argument("--revision", default=None, help="Branch to upload to (created if needed).")
    parser.add_argument(
        "--commit-message", "--commit_message", default="Upload Transformer (Vaswani et al., 2017) translation model"
    )
    parser.add_argument("--source-lang", "--source_lang", default=None, help="Source language code, e.g. en.")
    parser.add_argument("--target-lang", "--target_lang", default=None, help="Target language code, e.g. de.")
    parser.add_argument("--license", default="apache-2.0")
    parser.add_argument("--dataset", action="append", default=[], help="Training dataset (Hub id or name); repeat.")
    parser.add_argument(
        "--eval-results",
        "--eval_results",
        action="append",
        default=[],
        help="Evaluation JSON written by scripts/evaluate.py; repeat for several test sets.",
    )
    parser.add_argument(
        "--training-run",
        "--training_run",
        default=None,
        help="Training output folder to read the recipe from (default: the model folder, then its parent).",
    )
    parser.add_argument(
        "--model-name", "--model_name", default=None, help="Title of the model card (default: from the repo id)."
    )
    parser.add_argument(
        "--validation-sentence", "--validation_sentence", default="A man is riding a bicycle down the street."
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.output_dir is None and args.repo_id is None:
        print("error: give --output-dir (dry run) or --repo-id (upload).", file=sys.stderr)
        return 2
    card_options = dict(
        source_lang=args.source_lang,
        target_lang=args.target_lang,
        license=args.license,
        datasets=args.dataset or None,
        model_name=args.model_name,
        repo_id=args.repo_id,
    )
    training_info = training_info_from_run(args.training_run) if args.training_run else None
    try:
        with tempfile.TemporaryDirectory(prefix="vaswani-hub-") as scratch:
            folder = export_repository(
                args.model,
                args.output_dir or scratch,
                training_info=training_info,
                eval_results=args.eval_results or None,
                overwrite=args.overwrite,
                **card_options,
            )
            if args.output_dir is not None:  # dry run (the repo id, if given, only names the card)
                report = validate_repository(folder, args.validation_sentence)
                print(f"Wrote {folder}; it translates in a clean Python: {json.dumps(report, ensure_ascii=False)}")
                return 0
            url = push_repository(
                folder,
                args.repo_id,
                private=args.private,
                revision=args.revision,
                commit_message=args.commit_message,
                validation_sentence=args.validation_sentence,
            )
            print(f"Uploaded {folder} to {url}")
    except RepositoryValidationError as error:
        print(f"error: refusing to upload: {error}", file=sys.stderr)
        return 1
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
