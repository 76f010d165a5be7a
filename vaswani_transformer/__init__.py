"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a native Hugging Face model.

Importing the package registers the configuration and models with AutoConfig, AutoModel and
AutoModelForSeq2SeqLM, and makes `pipeline("translation", model=...)` work for our models in any import order
(transformers 5 removed that task; see `vaswani_transformer.pipeline.register_translation_pipeline`, the one place
that touches transformers' globals).
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_vaswani_transformer import (
    PRESETS,
    VaswaniTransformerConfig,
    available_presets,
    preset_training_arguments,
)
from .generation import (
    PAPER_GENERATION_DEFAULTS,
    VaswaniGenerationConfig,
    gnmt_length_penalty,
    paper_beam_search,
)
from .modeling_vaswani_transformer import (
    VaswaniTransformerForConditionalGeneration,
    VaswaniTransformerModel,
    VaswaniTransformerPreTrainedModel,
    packed_cpu_weights,
    release_packed_weights,
    sinusoidal_position_encoding,
)
from .hardware import warn_if_emulated
from .pipeline import TranslationPipeline, register_translation_pipeline

__version__ = "0.1.0"

AutoConfig.register(VaswaniTransformerConfig.model_type, VaswaniTransformerConfig, exist_ok=True)
AutoModel.register(VaswaniTransformerConfig, VaswaniTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration, exist_ok=True)
# `save_pretrained` writes `auto_map` and copies the modeling files (and the files they import) for remote code.
VaswaniTransformerConfig.register_for_auto_class()
VaswaniTransformerModel.register_for_auto_class("AutoModel")
VaswaniTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
register_translation_pipeline()
TranslationPipeline.precision_check = staticmethod(warn_if_emulated)  # a warning for a precision the CPU emulates

__all__ = [
    "PAPER_GENERATION_DEFAULTS",
    "PRESETS",
    "TranslationPipeline",
    "VaswaniGenerationConfig",
    "VaswaniTransformerConfig",
    "VaswaniTransformerForConditionalGeneration",
    "VaswaniTransformerModel",
    "VaswaniTransformerPreTrainedModel",
    "available_presets",
    "gnmt_length_penalty",
    "packed_cpu_weights",
    "paper_beam_search",
    "preset_training_arguments",
    "register_translation_pipeline",
    "release_packed_weights",
    "sinusoidal_position_encoding",
]
