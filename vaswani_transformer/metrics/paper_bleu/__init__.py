"""The `paper_bleu` evaluate module: see `paper_bleu.py`."""
