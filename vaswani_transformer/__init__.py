"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a native Hugging Face model.

Importing the package registers the configuration and models with AutoConfig, AutoModel and
AutoModelForSeq2SeqLM.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_vaswani_transformer import (
    PRESETS,
    VaswaniTransformerConfig,
    available_presets,
    preset_training_arguments,
)
from .modeling_vaswani_transformer import (
    VaswaniTransformerForConditionalGeneration,
    VaswaniTransformerModel,
    VaswaniTransformerPreTrainedModel,
    sinusoidal_position_encoding,
)

__version__ = "0.1.0"

AutoConfig.register(VaswaniTransformerConfig.model_type, VaswaniTransformerConfig, exist_ok=True)
AutoModel.register(VaswaniTransformerConfig, VaswaniTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration, exist_ok=True)
# `save_pretrained` writes `auto_map` and copies the modeling files (and the files they import) for remote code.
VaswaniTransformerConfig.register_for_auto_class()
VaswaniTransformerModel.register_for_auto_class("AutoModel")
VaswaniTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

__all__ = [
    "PRESETS",
    "VaswaniTransformerConfig",
    "VaswaniTransformerForConditionalGeneration",
    "VaswaniTransformerModel",
    "VaswaniTransformerPreTrainedModel",
    "available_presets",
    "preset_training_arguments",
    "sinusoidal_position_encoding",
]
