"""Evaluation modules shipped with the package (loadable with `evaluate.load(<path>)` offline)."""
