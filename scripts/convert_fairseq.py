"""Convert a fairseq Transformer checkpoint into one of our model folders: `vaswani_transformer.fairseq_import.main`."""

from vaswani_transformer.fairseq_import import main


if __name__ == "__main__":
    raise SystemExit(main())
