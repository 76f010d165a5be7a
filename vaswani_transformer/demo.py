"""A demo of the model's Hugging Face life cycle: preset -> save -> AutoModelForSeq2SeqLM -> generate."""


import torch
from transformers import AutoModelForSeq2SeqLM

from . import cli
from .configuration_vaswani_transformer import VaswaniTransformerConfig
from .modeling_vaswani_transformer import VaswaniTransformerForConditionalGeneration


def run_demo(preset: str, output_dir: str, vocab_size: int = 37000, seed: int = 0) -> str:
    """Build an untrained model from `preset`, save it to `output_dir`, reload it through the Auto classes and
    decode a random source with the model's default generation settings; returns a short report."""
    torch.manual_seed(seed)
    config = VaswaniTransformerConfig.from_preset(preset, vocab_size=vocab_size)
    model = VaswaniTransformerForConditionalGeneration(config)
    model.save_pretrained(output_dir)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(output_dir).eval()
    source = torch.randint(4, vocab_size, (1, 8))
    with torch.no_grad():
        output = reloaded.generate(input_ids=source, max_new_tokens=10)
    parameters = sum(p.numel() for p in reloaded.parameters())
    return (
        f"preset {preset!r}: {parameters / 1e6:.1f}M parameters, saved to {output_dir} and reloaded as "
        f"{type(reloaded).__name__}\nsource ids {source[0].tolist()}\ngenerated ids {output[0].tolist()}"
    )


def main(argv=None) -> None:
    """`scripts/demo.py`: build, save, reload and generate with an untrained preset."""
    parser = cli.ArgumentParser(description="Build a model from a paper preset, save it, reload it with "
                                     "AutoModelForSeq2SeqLM and generate (untrained: the ids are random).")
    parser.add_argument("--preset", default="base", help="a paper preset (see vaswani_transformer.available_presets())")
    parser.add_argument("--vocab_size", "--vocab-size", type=int, help="vocabulary size (default: run_demo's)")
    parser.add_argument("--output_dir", "--output-dir", default="outputs/demo")
    args = parser.parse_args(argv)
    options = {} if args.vocab_size is None else {"vocab_size": args.vocab_size}
    print(run_demo(args.preset, args.output_dir, **options))


if __name__ == "__main__":  # python -m vaswani_transformer.demo
    main()
