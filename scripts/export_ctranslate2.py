"""Convert one of our models into a CTranslate2 model folder: `vaswani_transformer.ctranslate2_export.main`."""

from vaswani_transformer.ctranslate2_export import main


if __name__ == "__main__":
    raise SystemExit(main())
