"""Decoding as the paper did it (Section 6.1): beam search with the GNMT length penalty.

This file is copied next to the weights for `trust_remote_code` users: it imports only torch and transformers.
"""

from transformers import GenerationMixin


class VaswaniGenerationMixin(GenerationMixin):
    """`generate` for the Transformer (placeholder: transformers' own beam search until the paper's lands)."""
