"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), Section 3, top to bottom.

3.5 positional encoding, 3.2 attention, 3.3 feed-forward network, 3.1 encoder and decoder layers and stacks,
3.4 embeddings and softmax. Every sub-layer is post-LN: LayerNorm(x + Dropout(Sublayer(x))).

Initialisation (not specified by the paper; the one of the common reproductions, e.g. fairseq's
`transformer_wmt_en_de`): linear layers Xavier-uniform with zero biases, embeddings N(0, d_model^-0.5) with the
padding row zero (so that embeddings x sqrt(d_model) have unit scale and the tied output projection starts with
logits of order 1), LayerNorm weight 1 and bias 0.

This file is copied next to the weights by `save_pretrained` for `trust_remote_code` users: it imports only torch,
transformers and sibling files under the same rule.
"""

import contextlib
import contextvars
import math
import weakref
from collections.abc import Callable

import torch
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPastAndCrossAttentions, Seq2SeqLMOutput
from transformers.modeling_outputs import Seq2SeqModelOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, is_torchdynamo_compiling
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vaswani_transformer import VaswaniTransformerConfig
from .generation import COMPILED_CALLS, SHARED_SOURCE_KERNELS, VaswaniGenerationConfig, VaswaniGenerationMixin
from .generation import source_padding_mask


# 5.4 Dropout ---------------------------------------------------------------------------------------------------------


def dropout_keep_mask(shape: torch.Size, p: float, device=None, dtype=torch.float32) -> torch.Tensor:
    """Bernoulli(1 - p) keep mask, 1 kept and 0 dropped in `dtype`, from 16 random bits per element, four elements per
    64-bit draw; p is rounded to a multiple of 2^-16."""
    count = math.prod(shape)
    words = torch.empty((count + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)  # all 64 bits
    bits, threshold = words.view(torch.int16)[:count].view(shape), round(p * 65536) - 32768  # kept: bits >= threshold
    if not -32768 < threshold <= 32767:  # p under 2^-17 keeps all, over 1 - 2^-17 drops all
        return torch.full(shape, float(threshold <= -32768), dtype=dtype, device=device)
    # 0 / 1 by clamping to [threshold - 1, threshold] in int16: on a CPU a comparison into a bool tensor, and products
    # with one, are not vectorised (~4x slower each); int16 arithmetic is
    return bits.clamp(threshold - 1, threshold).sub_(threshold - 1).to(dtype)


class Dropout(nn.Dropout):
    """Section 5.4: Dropout(x) = x * mask / (1 - P_drop), mask ~ Bernoulli(1 - P_drop) for each element.

    On a CPU the mask comes from `dropout_keep_mask`: torch's `bernoulli_` draws one random number per element in a
    serial loop (~10% of a small model's training step), this a quarter as many. Elsewhere, torch's dropout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:  # the identity, as torch's dropout returns it (decoding steps: cheap)
            return x
        if x.device.type != "cpu" or self.p >= 1.0 or is_torchdynamo_compiling():
            return super().forward(x)
        return x * dropout_keep_mask(x.shape, self.p, x.device, x.dtype) * (1.0 / (1.0 - self.p))


# Linear maps (xW^T + b in 3.2.2, 3.3 and 3.4) ------------------------------------------------------------------------

# x86 (measured with AVX-512 and AVX2): elsewhere oneDNN's products may not be the faster ones.
_HAS_ONEDNN_LINEAR = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
)
_ONEDNN_BF16 = _HAS_ONEDNN_LINEAR and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def cpuinfo_field(name: str) -> str:
    """The first value of a field of /proc/cpuinfo ("vendor_id": "GenuineIntel", "AuthenticAMD"; "flags"); "" where
    there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.partition(":")[0].strip() == name:
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


# Below, oneDNN's call costs more than the packed product saves. MKL multiplies a weight of up to 1 MiB (2^18 float32
# entries) fast on Intel CPUs at a beam step's 4 rows (packed: 0.68-0.73x), so there only larger ones are packed
# (2^19: 1.03-1.11x); on AMD CPUs MKL takes a slower path and packing pays from 512 x 512 (1.4x).
_CPU_VENDOR = cpuinfo_field("vendor_id")
_PACK_MIN_WEIGHTS = 1 << 19 if _CPU_VENDOR == "GenuineIntel" else 1 << 18
# bf16 has no MKL path: W as stored goes through oneDNN too, reordered at every call, so packing pays from 128 x 128
# (1.2-2x at 1-256 rows, Intel Xeon, on AMX and on oneDNN's AVX-512 bf16 code alike); below, one row may take a
# lighter path (64 x 64: 5 against 24 us).
_PACK_MIN_WEIGHTS_BF16 = 1 << 14


def _pack_min_weights(dtype: torch.dtype) -> int:
    """The fewest entries a weight of `dtype` needs for `linear` to pack it (`_onednn_packs`)."""
    return _PACK_MIN_WEIGHTS_BF16 if dtype == torch.bfloat16 else _PACK_MIN_WEIGHTS


# Packed at a layer's 4th use in a call: by then its plain products have cost about what packing costs (base's output
# layer: 3 x 20 ms against 93 ms), so a short output never pays much more than it would have without packing.
_PACK_AT_USE = 4


def _onednn_float32_faster(vendor: str, family: int, capability: str) -> bool:
    """Whether oneDNN's float32 product beats MKL's on a CPU of this vendor, family and torch capability. MKL runs its
    AVX2 code on x86 CPUs other than Intel's, oneDNN its AVX-512 code: 2.1-2.3x faster where 512-bit vectors run at
    full width (Zen 5, family 26, 2 threads) from 16 rows up; below, MKL's lighter call wins for small weights, but not
    from 2^19 entries (a beam step's 1-8 rows before its weights are packed: 1.1-1.6x with 1 thread, 1.9-3.4x with 2).
    Earlier AMD CPUs (Zen 4, family 25) run a 512-bit vector as two halves: 0.96-1.04x in training and decoding, and
    oneDNN's kernels per shape held 1.7 GB against MKL's 0.9. With AVX2 alone the two are within 10%."""
    if capability != "AVX512" or vendor in ("GenuineIntel", ""):
        return False
    return not (vendor == "AuthenticAMD" and family < 26)


_ONEDNN_FP32_FASTER = _HAS_ONEDNN_LINEAR and _onednn_float32_faster(
    _CPU_VENDOR, int(cpuinfo_field("cpu family") or 0), torch.backends.cpu.get_cpu_capability()
)
_ONEDNN_MIN_ROWS, _ONEDNN_ANY_ROWS_WEIGHTS = 16, 1 << 19
_PACKED_WEIGHTS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("packed_weights", default=None)
# Each packed layer's last packed copy and a plain copy of the W it was packed from, kept from block to block while the
# layer lives: a later block multiplies on it from the first use where W holds the same bits (`_same_bits`).
_KEPT_PACKS: "weakref.WeakKeyDictionary[nn.Linear, tuple[torch.Tensor, torch.Tensor]]" = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def packed_cpu_weights():
    """Within (each `generate` call): a linear layer used a fourth time (decoding steps) on a CPU, outside autograd,
    multiplies through oneDNN on a copy of its weight packed then. The copy is kept after the block, with a plain copy
    of the weight: a later block whose W holds the same bits multiplies on it from the first use, and one whose W has
    changed in any way (fused optimizers and `.data` writes change weights without telling anyone) packs anew.
    `release_packed_weights` (and `model.train()`, `model.to(...)`) drop them. A block inside another uses the outer
    one's."""
    if _PACKED_WEIGHTS.get() is not None:
        yield
        return
    token = _PACKED_WEIGHTS.set({})
    try:
        yield
    finally:
        _PACKED_WEIGHTS.reset(token)


def release_packed_weights(model: nn.Module) -> None:
    """Drops the packed copies of `model`'s linear layers kept by `packed_cpu_weights` (and the plain copies they
    are checked against), freeing their memory; the next `generate` packs again."""
    if not _KEPT_PACKS:  # (nothing kept: `train()` and `.to()` call this on every use)
        return
    for module in model.modules():
        _KEPT_PACKS.pop(module, None)


def _same_bits(weight: torch.Tensor, copy: torch.Tensor) -> bool:
    """Whether `weight` holds exactly `copy`'s bits (shape, dtype and device too), compared as integers: a float
    comparison would take -0.0 for 0.0 and never a NaN for itself. As 64-bit words where W allows: twice as fast."""
    if weight.shape != copy.shape or weight.dtype != copy.dtype or weight.device != copy.device:
        return False
    weight = weight.detach().contiguous()
    if weight.numel() * weight.element_size() % 8 == 0 and weight.storage_offset() * weight.element_size() % 8 == 0:
        return torch.equal(weight.view(-1).view(torch.int64), copy.view(-1).view(torch.int64))
    return torch.equal(weight.view(-1).view(torch.uint8), copy.view(-1).view(torch.uint8))


def _kept_pack(layer: nn.Linear, weight: torch.Tensor) -> torch.Tensor | None:
    """The packed copy kept for `layer` where its W holds the bits it was packed from; a stale one is dropped."""
    kept = _KEPT_PACKS.get(layer)
    if kept is None:
        return None
    if _same_bits(weight, kept[0]):
        return kept[1]
    _KEPT_PACKS.pop(layer, None)  # (another thread may have dropped it already)
    return None


def _onednn_may_multiply(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether oneDNN may multiply x and W here: both on a CPU, not traced (a trace sees the plain product), mkldnn
    enabled, no autocast (it multiplies in its own dtype)."""
    return (
        x.device.type == "cpu"
        and weight.device.type == "cpu"
        and not torch.jit.is_tracing()
        and torch.backends.mkldnn.enabled
        and not torch.is_autocast_enabled("cpu")
    )


def _onednn_packs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` may multiply on a packed weight: oneDNN here and allowed (`_onednn_may_multiply`), no autograd,
    float32 or a bf16 that oneDNN supports here, a weight worth packing (`_pack_min_weights`)."""
    return (  # the size first: it rules out most layers
        weight.numel() >= _pack_min_weights(weight.dtype)
        and _HAS_ONEDNN_LINEAR
        and not torch.is_grad_enabled()
        and x.dtype == weight.dtype
        and (x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and _ONEDNN_BF16))
        and _onednn_may_multiply(x, weight)
    )


def _onednn_multiplies_float32(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` multiplies float32 through oneDNN on W as stored: where MKL is the slower
    (`_ONEDNN_FP32_FASTER`), at least `_ONEDNN_MIN_ROWS` rows or a W of at least `_ONEDNN_ANY_ROWS_WEIGHTS` entries,
    oneDNN allowed (`_onednn_may_multiply`)."""
    return (
        _ONEDNN_FP32_FASTER
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and (x.numel() >= _ONEDNN_MIN_ROWS * x.shape[-1] or weight.numel() >= _ONEDNN_ANY_ROWS_WEIGHTS)
        and _onednn_may_multiply(x, weight)
    )


def _onednn_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """xW^T + b by oneDNN: W read in any layout (a transposed view as it is), x copied first where not contiguous."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _bucketed_rows(rows: int) -> int:
    """`rows` rounded up to one of 16 sizes per doubling from 32 on (at most 1/16 more): oneDNN compiles kernels for
    each row count it meets and keeps them for good (~0.3 MB each, the primitive cache's capacity aside)."""
    if rows < 32:
        return rows
    step = 1 << (rows.bit_length() - 5)
    return -(-rows // step) * step


def _onednn_product_bucketed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`_onednn_product` on `x`'s rows zero-padded to `_bucketed_rows` (the padding's rows dropped from the result):
    decoding and translating meet every row count up to a batch's, and a long job would otherwise keep adding kernels
    (a 100,000-line translation held 1.5 GB of heap instead of 0.9)."""
    rows = x.numel() // x.shape[-1]
    padded = _bucketed_rows(rows)
    if padded == rows:
        return _onednn_product(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    product = _onednn_product(torch.cat([flat, flat.new_zeros(padded - rows, flat.shape[1])]), weight, bias)
    return product[:rows].view(*x.shape[:-1], product.shape[-1])


class _OneDNNLinear(torch.autograd.Function):
    """xW^T + b and its gradients, dL/dx = g W, dL/dW = g^T x, dL/db = sum of g over rows, each product by oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_product(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_rows = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_product(grad_rows, weight.t()).view(x.shape)
        if ctx.needs_input_grad[1]:
            x_rows = x.reshape(-1, x.shape[-1])
            if grad_rows.shape[1] > x_rows.shape[1]:  # g the larger: oneDNN's weight, x^T the copied one; (x^T g)^T
                grad_weight = _onednn_product(x_rows.t(), grad_rows.t()).t().contiguous()
            else:
                grad_weight = _onednn_product(grad_rows.t(), x_rows.t())
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_rows.sum(0)
        return grad_x, grad_weight, grad_bias


# Hooks that every module's call runs (torch's `register_module_forward_hook` and kin).
_GLOBAL_MODULE_HOOKS = tuple(
    getattr(torch.nn.modules.module, name, {})
    for name in ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                 "_global_backward_hooks")
)  # fmt: skip


_PLAIN_TENSORS = (nn.Parameter, torch.Tensor)


def _product_operands(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(W, b) where `layer(x)` is F.linear(x, W, b) and nothing else, else None: an `nn.Linear` itself (quantized,
    8-bit and LoRA layers are other classes), plain tensors for W and b (not torchao's), no hooks of its own or global
    ones (pruning's, FSDP's), no replaced `forward` (accelerate's offloading) and no compiled call; not inside a
    compiled graph or a trace, which see `layer(x)` as it is, nor under torch.func's transforms (vmap, grad: oneDNN's
    ops and `_OneDNNLinear` have no rules for them). Read from the layer's own dicts: a decoding step asks 24-100
    times."""
    if type(layer) is not nn.Linear:
        return None
    state = layer.__dict__
    weight, bias = state["_parameters"].get("weight"), state["_parameters"].get("bias")
    if (
        type(weight) not in _PLAIN_TENSORS
        or (bias is not None and type(bias) not in _PLAIN_TENSORS)
        or state["_forward_pre_hooks"] or state["_forward_hooks"]
        or state["_backward_pre_hooks"] or state["_backward_hooks"]
        or "forward" in state
        or getattr(layer, "_compiled_call_impl", None) is not None
        or any(_GLOBAL_MODULE_HOOKS)
        or is_torchdynamo_compiling()
        or torch.jit.is_tracing()
        or torch._C._are_functorch_transforms_active()
    ):  # fmt: skip
        return None
    return weight, bias


def linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """xW^T + b of an `nn.Linear` layer, `layer(x)`. Where that is the product alone (`_product_operands`), on a CPU:
    inside `packed_cpu_weights`, from its fourth use on (from the first where an earlier block's copy matches W),
    through oneDNN on a packed copy of W (of at least 512 x 512 entries, 512 x 1024 on Intel CPUs; in bf16 128 x 128):
    MKL's product on W as stored is 1.1-3x slower on x86, most at the few rows of a beam search step and the largest W
    (in bf16, oneDNN's on W as stored, 1.2-2x). In float32 on AVX-512 CPUs not Intel's but for AMD's before Zen 5
    (`_onednn_float32_faster`), where MKL takes its AVX2 path, through oneDNN on W as stored otherwise, training's
    gradients included. The layers stay
    `nn.Linear`, so that torch's dynamic quantization, PEFT, bitsandbytes and hooks find and replace or watch them as
    in any model."""
    operands = _product_operands(layer)
    if operands is None:
        return layer(x)
    weight, bias = operands
    packs = _PACKED_WEIGHTS.get()
    if packs is not None and _onednn_packs(x, weight):
        uses = packs.get(layer)  # the uses so far in this block, until packed
        if uses is None:
            kept = _kept_pack(layer, weight)
            uses = packs[layer] = 0 if kept is None else kept
        if isinstance(uses, int) and uses + 1 >= _PACK_AT_USE:
            uses = packs[layer] = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
            _KEPT_PACKS[layer] = (weight.detach().clone(memory_format=torch.contiguous_format), uses)
        if not isinstance(uses, int):
            return _onednn_product_bucketed(x, uses, bias)
        packs[layer] = uses + 1
    if _onednn_multiplies_float32(x, weight):
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return _OneDNNLinear.apply(x, weight, bias)  # training: token batches' shapes recur
        return _onednn_product_bucketed(x, weight, bias)
    return nn.functional.linear(x, weight, bias)


# 3.5 Positional encoding ---------------------------------------------------------------------------------------------


def sinusoidal_position_encoding(
    num_positions: int, d_model: int, offset: int | torch.Tensor = 0, device=None, dtype=torch.float32
) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)); shape (n, d_model)."""
    # `offset` may be a 0-d tensor (a static cache's length): added to, not a bound of, arange, so it compiles.
    positions = torch.arange(num_positions, device=device, dtype=_angle_dtype(dtype)) + offset
    return sinusoidal_encoding_at(positions, d_model).to(dtype)


def sinusoidal_encoding_at(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """The paper's encoding of each of `positions` (a float tensor of any shape): shape (*positions.shape, d_model)."""
    two_i = torch.arange(0, d_model, 2, device=positions.device, dtype=positions.dtype)
    angles = positions[..., None] / torch.pow(10000.0, two_i / d_model)
    encoding = positions.new_zeros(*positions.shape, d_model)
    encoding[..., 0::2] = torch.sin(angles)
    encoding[..., 1::2] = torch.cos(angles[..., : d_model // 2])
    return encoding


def tensor2tensor_position_encoding(
    num_positions: int, d_model: int, offset: int | torch.Tensor = 0, device=None, dtype=torch.float32
) -> torch.Tensor:
    """The authors' code (tensor2tensor, fairseq): [sin(pos w_i) | cos(pos w_i)], w_i = 10000^(-i/(d_model/2 - 1))."""
    positions = torch.arange(num_positions, device=device, dtype=_angle_dtype(dtype)) + offset
    return tensor2tensor_encoding_at(positions, d_model).to(dtype)


def tensor2tensor_encoding_at(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """The authors' code's encoding of each of `positions` (a float tensor of any shape)."""
    half = d_model // 2
    steps = torch.arange(half, device=positions.device, dtype=positions.dtype)
    frequencies = torch.exp(steps * -(math.log(10000.0) / (half - 1)))
    angles = positions[..., None] * frequencies
    encoding = positions.new_zeros(*positions.shape, d_model)  # odd d_model: last column 0
    encoding[..., :half] = torch.sin(angles)
    encoding[..., half : 2 * half] = torch.cos(angles)
    return encoding


def _angle_dtype(dtype: torch.dtype) -> torch.dtype:
    """Angles in float64 for a float64 model (exact far beyond training lengths), float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def positions_from_mask(
    attention_mask: torch.Tensor, length: int, past_length: int | torch.Tensor = 0
) -> torch.Tensor:
    """Positions of tokens past_length..past_length+length-1 of a 2-D padding mask: each real token's number among the
    real tokens up to it, minus one (cumsum(mask) - 1, as transformers' `generate` numbers left-padded prompts);
    padding at 0."""
    mask = attention_mask.long()
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    # index_select, not a slice: past_length may be a 0-d tensor (a static cache's length) inside a compiled graph.
    return positions.index_select(-1, torch.arange(length, device=mask.device) + past_length)


def _is_padding_mask(attention_mask) -> bool:
    """A 2-D (batch, length) mask of real tokens (not a prepared 4-D mask or a flex-attention block mask)."""
    return isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 2


class SinusoidalPositionalEncoding(nn.Module):
    """Section 3.5: fixed sinusoids, computed at run time for any length (no parameters, nothing in the checkpoint).

    The first positions' encodings are computed once and kept (as fairseq keeps its table): a decoding step needs
    one row, which would cost ~10 small operator calls to compute each step."""

    TABLE_POSITIONS = 1024  # the most positions kept; later ones, a static cache's and a compiled graph's are computed

    def __init__(self, d_model: int, layout: str = "sinusoidal", position_offset: int = 0):
        super().__init__()
        self.d_model = d_model
        self.position_offset = position_offset
        self.encode = tensor2tensor_encoding_at if layout == "tensor2tensor" else sinusoidal_encoding_at
        self._table: torch.Tensor | None = None  # not a buffer: never saved, and `.to` would cast float64 angles

    def forward(
        self, seq_len: int, offset: int | torch.Tensor, like: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Encodings of positions offset..offset+seq_len-1 (seq_len, d_model), or of `position_ids` (batch, seq_len)."""
        angle_dtype = _angle_dtype(like.dtype)
        if position_ids is None and isinstance(offset, int) and not is_torchdynamo_compiling():
            end = offset + seq_len
            if end <= self.TABLE_POSITIONS:
                table = self._kept_table(end, like.device, angle_dtype)
                return table[offset:end].to(like.dtype, copy=True)  # a copy: the caller may write into it
        if position_ids is None:
            positions = torch.arange(seq_len, device=like.device, dtype=angle_dtype) + offset
        else:
            positions = position_ids.to(device=like.device, dtype=angle_dtype)
        return self.encode(positions + self.position_offset, self.d_model).to(like.dtype)

    def _kept_table(self, positions: int, device: torch.device, angle_dtype: torch.dtype) -> torch.Tensor:
        """The encodings of at least `positions` first positions on `device` from `angle_dtype` angles, computed
        where the kept ones are fewer or other (a power of two of them, at least 64)."""
        table = self._table
        if table is None or len(table) < positions or table.device != device or table.dtype != angle_dtype:
            count = min(self.TABLE_POSITIONS, max(64, 1 << (positions - 1).bit_length()))
            angles = torch.arange(count, device=device, dtype=angle_dtype) + self.position_offset
            table = self._table = self.encode(angles, self.d_model)
        return table


class LearnedPositionalEmbedding(nn.Embedding):
    """Table 3 row (E): learned positional embeddings, limited to `max_position_embeddings` positions."""

    def forward(
        self, seq_len: int, offset: int | torch.Tensor, like: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        if position_ids is None:
            positions = torch.arange(seq_len, device=self.weight.device) + offset
            needed = None if is_torchdynamo_compiling() else offset + seq_len
        else:
            positions = position_ids.to(self.weight.device)
            needed = None if is_torchdynamo_compiling() or positions.numel() == 0 else int(positions.max()) + 1
        if needed is not None and needed > self.num_embeddings:
            raise ValueError(
                f"Sequence of {needed} positions is longer than the {self.num_embeddings} learned positions "
                "(`max_position_embeddings`); truncate the input or use position_encoding='sinusoidal'."
            )
        return super().forward(positions).to(like.dtype)


class TransformerEmbedding(nn.Module):
    """Section 3.4 + 3.5: Dropout(Embedding(tokens) * sqrt(d_model) + PE)."""

    def __init__(self, config: VaswaniTransformerConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        if config.position_encoding == "learned":
            self.embed_positions = LearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
        else:
            self.embed_positions = SinusoidalPositionalEncoding(
                config.d_model, config.position_encoding, config.position_offset
            )
        self.dropout = Dropout(config.dropout)

    def forward(
        self, input_ids=None, inputs_embeds=None, offset: int | torch.Tensor = 0, position_ids=None
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden_states = inputs_embeds * self.scale
        positions = self.embed_positions(hidden_states.shape[1], offset, like=hidden_states, position_ids=position_ids)
        return self.dropout(hidden_states + positions)


# 3.2 Attention -------------------------------------------------------------------------------------------------------


# torch's CPU softmax over a last dimension shorter than one vector of float32 (16 with AVX-512, 8 with AVX2) runs ~10x
# slower per entry (13-16 against 1-2 ns, forward and backward alike: Intel Xeon, also with torch's AVX2 kernels); a
# batch of short sentences attends over 10-15 keys.
_SOFTMAX_FAST_KEYS = 16 if torch.backends.cpu.get_cpu_capability() == "AVX512" else 8


def softmax_over_keys(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """softmax(scores) over the keys (the last dimension) in `dtype`. On a CPU, fewer keys than a vector holds
    (`_SOFTMAX_FAST_KEYS`) are padded to a vector's with scores of -inf, whose weights are exactly 0: the same
    probabilities from torch's faster kernel, returned as a view of the real keys' columns. Not in a compiled graph
    or a trace, which see the plain softmax (a trace would keep one padding width for every length)."""
    keys = scores.shape[-1]
    if (
        keys >= _SOFTMAX_FAST_KEYS
        or scores.device.type != "cpu"
        or is_torchdynamo_compiling()
        or torch.jit.is_tracing()
    ):
        return nn.functional.softmax(scores, dim=-1, dtype=dtype)
    padded = nn.functional.pad(scores, (0, _SOFTMAX_FAST_KEYS - keys), value=float("-inf"))
    return nn.functional.softmax(padded, dim=-1, dtype=dtype)[..., :keys]


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Equation (1): Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, with an additive mask."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    # Softmax in float32 for half precision, in float64 for a float64 model: cast to float32, its mask's minimum
    # would be -inf, and a query that sees no key (the padding of a left-padded prompt) NaN, spreading to later layers.
    weights = softmax_over_keys(scores, torch.promote_types(scores.dtype, torch.float32))
    weights = weights.to(query.dtype).contiguous()
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


# torch's CPU SDPA kernel multiplies bf16 on AMX tiles where the CPU has them (Intel Xeons since Sapphire Rapids)
_AMX_TILES = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
# On Intel CPUs (MKL's own products) float32's written-out equation pays only from 64 rows: at 16, SDPA's kernel is
# 1.2-1.3x the faster, at 64 the two are even, at 256 it is 1.1-1.4x the slower (Intel Xeon, 8-75 keys).
_ONE_QUERY_EAGER_MIN_ROWS_FP32 = 64 if _CPU_VENDOR == "GenuineIntel" else 1


def _one_query_faster_eager(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether equation (1) written out beats torch's SDPA kernel: one query per row (a decoding step) on a CPU, over
    16 keys or more and 256 rows x keys or more, where SDPA's kernel is 1.2-1.7x slower in float32 and, without AMX,
    2-9x in bf16 (Zen 5); at fewer keys or rows (one sentence's beams) its single call costs less than the written-out
    ops. In bf16 on a CPU with AMX, SDPA's kernel is 1.3-7x the faster at every such shape, and in float32 on an Intel
    CPU below 64 rows (Intel Xeon) (`benchmarks/beam_search_speed.py --attention`)."""
    keys = key.shape[-2]
    return (
        query.shape[-2] == 1
        and query.device.type == "cpu"
        and keys >= 16
        and query.shape[0] * keys >= 256
        and not (query.dtype == torch.bfloat16 and _AMX_TILES)
        and not (query.dtype == torch.float32 and query.shape[0] < _ONE_QUERY_EAGER_MIN_ROWS_FP32)
        and not is_torchdynamo_compiling()
    )


def _grouped_queries(
    query: torch.Tensor, attention_mask: torch.Tensor | None, groups: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Queries (sources * groups, h, n, d) as (sources, h, groups * n, d), and the sources' mask with them: the
    target rows of one source attend to its keys and values together, which are then read once, not once a row."""
    rows, heads, length, dim = query.shape
    sources = rows // groups
    query = query.reshape(sources, groups, heads, length, dim).transpose(1, 2).reshape(sources, heads, -1, dim)
    if attention_mask is not None and attention_mask.shape[-2] > 1:
        attention_mask = attention_mask.repeat(1, 1, groups, 1)
    return query, attention_mask


def _ungrouped_weights(weights: torch.Tensor, groups: int) -> torch.Tensor:
    """Attention weights (sources, h, groups * n, keys) back to one row per target: (sources * groups, h, n, keys)."""
    sources, heads, _, keys = weights.shape
    return weights.reshape(sources, heads, groups, -1, keys).transpose(1, 2).reshape(sources * groups, heads, -1, keys)


class MultiHeadAttention(nn.Module):
    """Section 3.2.2: MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)."""

    def __init__(self, config: VaswaniTransformerConfig, layer_idx: int | None = None, is_causal: bool = False):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = is_causal
        self.num_heads = config.num_heads
        self.d_k = config.head_dim_k
        self.d_v = config.head_dim_v
        self.scaling = self.d_k**-0.5
        self.attention_dropout = config.attention_dropout
        self.q_proj = nn.Linear(config.d_model, self.num_heads * self.d_k)
        self.k_proj = nn.Linear(config.d_model, self.num_heads * self.d_k)
        self.v_proj = nn.Linear(config.d_model, self.num_heads * self.d_v)
        self.o_proj = nn.Linear(self.num_heads * self.d_v, config.d_model)

    def _heads(self, states: torch.Tensor, head_dim: int) -> torch.Tensor:
        """(batch, length, h * d) -> (batch, h, length, d)."""
        return states.view(*states.shape[:-1], self.num_heads, head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        is_cross_attention = key_value_states is not None
        query = self._heads(linear(self.q_proj, hidden_states), self.d_k)

        layer_cache = cache
        if isinstance(cache, EncoderDecoderCache):
            layer_cache = cache.cross_attention_cache if is_cross_attention else cache.self_attention_cache
        if is_cross_attention and layer_cache is not None and cache.is_updated.get(self.layer_idx):
            # The source sentence does not change while decoding: its keys and values are computed once.
            key, value = layer_cache.layers[self.layer_idx].keys, layer_cache.layers[self.layer_idx].values
        else:
            source = key_value_states if is_cross_attention else hidden_states
            key = self._heads(linear(self.k_proj, source), self.d_k)
            value = self._heads(linear(self.v_proj, source), self.d_v)
            if layer_cache is not None:
                key, value = layer_cache.update(key, value, self.layer_idx)
                if is_cross_attention:
                    cache.is_updated[self.layer_idx] = True

        implementation = self.config._attn_implementation
        # SDPA cannot return the weights; its masks are boolean tensors that the eager path takes as they are.
        if implementation == "sdpa" and (kwargs.get("output_attentions", False) or _one_query_faster_eager(query, key)):
            implementation = "eager"
        elif ("flash" in implementation or "flex" in implementation) and kwargs.get("output_attentions", False):
            raise ValueError(
                f"output_attentions=True needs attn_implementation 'eager' or 'sdpa' (flash and flex attention "
                f"kernels return no weights: they came back empty); this model uses {implementation!r}: load it with "
                "attn_implementation='eager'."
            )
        # Target rows per source row (a sentence's beams share its source; the decoder checks the counts).
        groups = query.shape[0] // key.shape[0] if is_cross_attention else 1
        if groups > 1:
            query, attention_mask = _grouped_queries(query, attention_mask, groups)
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        output, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        if groups > 1 and weights is not None:
            weights = _ungrouped_weights(weights, groups)
        output = output.reshape(*hidden_states.shape[:-1], self.num_heads * self.d_v)
        return linear(self.o_proj, output), weights


# 3.3 Position-wise feed-forward network ------------------------------------------------------------------------------


class PositionwiseFeedForward(nn.Module):
    """Equation (2): FFN(x) = max(0, x W1 + b1) W2 + b2."""

    def __init__(self, config: VaswaniTransformerConfig):
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.d_ff)
        self.w2 = nn.Linear(config.d_ff, config.d_model)
        self.activation_dropout = Dropout(config.activation_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(self.w2, self.activation_dropout(torch.relu(linear(self.w1, x))))


# 3.1 Encoder and decoder layers --------------------------------------------------------------------------------------


class SublayerConnection(nn.Module):
    """Section 3.1 / 5.4: LayerNorm(x + Dropout(Sublayer(x))), the post-LN residual connection."""

    def __init__(self, config: VaswaniTransformerConfig):
        super().__init__()
        self.dropout = Dropout(config.dropout)
        self.layer_norm = nn.LayerNorm(config.d_model)

    def forward(self, x: torch.Tensor, sublayer_output: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(x + self.dropout(sublayer_output))


class EncoderLayer(GradientCheckpointingLayer):
    """Section 3.1: self-attention, then the feed-forward network, each in a post-LN residual connection."""

    def __init__(self, config: VaswaniTransformerConfig, layer_idx: int):
        super().__init__()
        self.self_attn = MultiHeadAttention(config, layer_idx)
        self.self_attn_residual = SublayerConnection(config)
        self.feed_forward = PositionwiseFeedForward(config)
        self.feed_forward_residual = SublayerConnection(config)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs) -> torch.Tensor:
        attended, _ = self.self_attn(hidden_states, attention_mask=attention_mask, **kwargs)
        hidden_states = self.self_attn_residual(hidden_states, attended)
        return self.feed_forward_residual(hidden_states, self.feed_forward(hidden_states))


class DecoderLayer(GradientCheckpointingLayer):
    """Section 3.1: masked self-attention, encoder-decoder attention, feed-forward network, each post-LN."""

    def __init__(self, config: VaswaniTransformerConfig, layer_idx: int):
        super().__init__()
        self.self_attn = MultiHeadAttention(config, layer_idx, is_causal=True)
        self.self_attn_residual = SublayerConnection(config)
        self.encoder_attn = MultiHeadAttention(config, layer_idx)
        self.encoder_attn_residual = SublayerConnection(config)
        self.feed_forward = PositionwiseFeedForward(config)
        self.feed_forward_residual = SublayerConnection(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        attended, _ = self.self_attn(hidden_states, attention_mask=attention_mask, cache=cache, **kwargs)
        hidden_states = self.self_attn_residual(hidden_states, attended)
        attended, _ = self.encoder_attn(
            hidden_states,
            key_value_states=encoder_hidden_states,
            attention_mask=encoder_attention_mask,
            cache=cache,
            **kwargs,
        )
        hidden_states = self.encoder_attn_residual(hidden_states, attended)
        return self.feed_forward_residual(hidden_states, self.feed_forward(hidden_states))


# Pre-trained model base: initialisation and common checks ------------------------------------------------------------


class VaswaniTransformerPreTrainedModel(PreTrainedModel):
    """Weight initialisation and loading conventions shared by the Transformer models."""

    config: VaswaniTransformerConfig
    config_class = VaswaniTransformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["EncoderLayer", "DecoderLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True

    def __init__(self, config: VaswaniTransformerConfig, *inputs, **kwargs):
        config.check_fields()  # values set after the config was built (from_pretrained's keywords) are checked too
        super().__init__(config, *inputs, **kwargs)

    def train(self, mode: bool = True):
        """`nn.Module.train`; into training, the packed weights kept for decoding go (`release_packed_weights`): the
        weights they copy are about to change, and they would hold memory all the while."""
        if mode:
            release_packed_weights(self)
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):
        """`nn.Module._apply` (under `.to()`, `.cuda()`, `.half()`...), after the packed weights kept for decoding go:
        the weights move or change dtype, so the copies could serve no more."""
        release_packed_weights(self)
        return super()._apply(fn, *args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        """Xavier-uniform linears with zero bias; embeddings N(0, d_model^-0.5) with a zero padding row."""
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = self.config.init_std if self.config.init_std is not None else self.config.d_model**-0.5
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        """transformers' resizing (encoder embedding, output layer), and the decoder's embedding where it is a matrix
        of its own: both sides index one vocabulary of `config.vocab_size` tokens."""
        embeddings = super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        decoder = getattr(self.base_model, "decoder", None)
        if decoder is not None and decoder.get_input_embeddings() is not embeddings:
            old = decoder.get_input_embeddings()
            new = self._get_resized_embeddings(old, embeddings.num_embeddings, mean_resizing=mean_resizing)
            decoder.set_input_embeddings(new.requires_grad_(old.weight.requires_grad))
        return embeddings

    def _check_token_ids(self, ids: torch.Tensor | None, name: str):
        """Raise a ValueError naming the id when a token id is outside the vocabulary (not a bare index error)."""
        if ids is None or is_torchdynamo_compiling() or ids.numel() == 0:
            return
        vocab_size = self.config.vocab_size
        outside = (ids < 0) | (ids >= vocab_size)
        if outside.any():
            bad = int(ids[outside][0])
            raise ValueError(f"{name} contains token id {bad}, outside the vocabulary of size {vocab_size}.")


# 3.1 Encoder and decoder stacks --------------------------------------------------------------------------------------


class VaswaniTransformerEncoder(VaswaniTransformerPreTrainedModel):
    """Section 3.1: the encoder, a stack of N identical layers over the embedded source."""

    _can_record_outputs = {"hidden_states": EncoderLayer, "attentions": MultiHeadAttention}

    def __init__(self, config: VaswaniTransformerConfig):
        super().__init__(config)
        self.embedding = TransformerEmbedding(config)
        self.layers = nn.ModuleList([EncoderLayer(config, i) for i in range(config.encoder_layers)])
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embedding.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding):
        self.embedding.embed_tokens = value

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self, input_ids=None, attention_mask=None, inputs_embeds=None, **kwargs: Unpack[TransformersKwargs]
    ) -> BaseModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Give exactly one of input_ids or inputs_embeds to the encoder.")
        self._check_token_ids(input_ids, "input_ids")
        if attention_mask is None:
            attention_mask = source_padding_mask(input_ids, self.config)
        # With a padding mask each real token takes the position it has alone, whichever side the padding is on.
        shape = tuple((input_ids if input_ids is not None else inputs_embeds).shape[:2])
        if _is_padding_mask(attention_mask) and tuple(attention_mask.shape) != shape:
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; the source's is {shape}.")
        position_ids = positions_from_mask(attention_mask, shape[1]) if _is_padding_mask(attention_mask) else None
        hidden_states = self.embedding(input_ids, inputs_embeds, position_ids=position_ids)
        attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            allow_is_bidirectional_skip=not kwargs.get("output_attentions", False),
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        return BaseModelOutput(last_hidden_state=hidden_states)


def _sources_per_target_rows(
    rows: int, encoder_hidden_states: torch.Tensor | None, encoder_attention_mask, kernel: str
):
    """The encoder's output and source mask for `rows` decoder rows, G >= 1 per source row (rows b * G ... (b + 1) * G
    - 1 read source b, as a sentence's beams do): as given for `SHARED_SOURCE_KERNELS`, whose cross-attention reads a
    source once for its G rows; G copies of each row for other kernels. A ValueError for other counts."""
    if encoder_hidden_states is None:
        return encoder_hidden_states, encoder_attention_mask
    sources = encoder_hidden_states.shape[0]
    if sources == 0 or rows % sources:
        raise ValueError(
            f"The decoder has {rows} rows and the encoder's output {sources}: each source row must serve the same "
            "number of consecutive target rows (1, or e.g. a sentence's beams)."
        )
    if _is_padding_mask(encoder_attention_mask) and encoder_attention_mask.shape[0] != sources:
        raise ValueError(
            f"attention_mask has {encoder_attention_mask.shape[0]} rows and the encoder's output {sources}: the "
            "source mask needs one row per source."
        )
    if rows == sources or kernel in SHARED_SOURCE_KERNELS:
        return encoder_hidden_states, encoder_attention_mask
    groups = rows // sources
    if isinstance(encoder_attention_mask, torch.Tensor):
        encoder_attention_mask = encoder_attention_mask.repeat_interleave(groups, 0)
    return encoder_hidden_states.repeat_interleave(groups, 0), encoder_attention_mask


class VaswaniTransformerDecoder(VaswaniTransformerPreTrainedModel):
    """Section 3.1: the decoder, a stack of N identical layers attending to itself (causally) and to the encoder."""

    _can_record_outputs = {
        "hidden_states": DecoderLayer,
        "attentions": OutputRecorder(MultiHeadAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(MultiHeadAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VaswaniTransformerConfig):
        super().__init__(config)
        self.embedding = TransformerEmbedding(config)
        self.layers = nn.ModuleList([DecoderLayer(config, i) for i in range(config.decoder_layers)])
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embedding.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding):
        self.embedding.embed_tokens = value

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        cache: Cache | None = None,
        inputs_embeds=None,
        use_cache: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Give exactly one of decoder_input_ids or decoder_inputs_embeds to the decoder.")
        self._check_token_ids(input_ids, "decoder_input_ids")
        encoder_hidden_states, encoder_attention_mask = _sources_per_target_rows(
            (input_ids if input_ids is not None else inputs_embeds).shape[0], encoder_hidden_states,
            encoder_attention_mask, self.config._attn_implementation,
        )  # fmt: skip
        if self.gradient_checkpointing and self.training:
            cache, use_cache = None, False  # the backward pass replays every layer, which would write a cache twice
        # Weights are returned through the eager path, which needs explicit masks (no is_causal shortcut).
        output_attentions = kwargs.get("output_attentions", False)
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        # Tokens already decoded: an int, or a 0-d tensor for static caches (positions stay in a compiled graph).
        past_length = cache.get_seq_length() if cache is not None else 0
        # Positions: given, else from the padding mask (a left-padded prompt's first real token is at 0, as when
        # alone), else past_length onwards.
        length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        if position_ids is None and _is_padding_mask(attention_mask):
            if isinstance(past_length, int) and attention_mask.shape[-1] != past_length + length:
                raise ValueError(
                    f"decoder_attention_mask has {attention_mask.shape[-1]} columns; it must cover the {past_length} "
                    f"cached tokens and the {length} new ones ({past_length + length}), as in transformers' generate."
                )
            position_ids = positions_from_mask(attention_mask, length, past_length)
        hidden_states = self.embedding(input_ids, inputs_embeds, offset=past_length, position_ids=position_ids)
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            cache=cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else None,
            allow_is_causal_skip=not output_attentions,
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
            allow_is_bidirectional_skip=not output_attentions,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,
                encoder_attention_mask=encoder_attention_mask,
                cache=cache,
                **kwargs,
            )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, cache=cache if use_cache else None
        )


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: the start token, then the labels without their last token (-100 -> pad)."""
    if pad_token_id is None or decoder_start_token_id is None:
        raise ValueError(f"Decoder inputs from labels need the config's pad_token_id and decoder_start_token_id; got "
                         f"{pad_token_id} and {decoder_start_token_id}.")
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


class VaswaniTransformerModel(VaswaniTransformerPreTrainedModel):
    """The encoder-decoder of Figure 1, without the output projection; returns the decoder's last hidden states."""

    def __init__(self, config: VaswaniTransformerConfig):
        super().__init__(config)
        if config.share_embeddings:
            # Section 3.4: one matrix for source and target embeddings (and, with a head, the output projection),
            # tied by `post_init`/`from_pretrained` as transformers' encoder-decoders do (checkpoints hold `shared`).
            self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            self._tied_weights_keys = {
                "encoder.embedding.embed_tokens.weight": "shared.weight",
                "decoder.embedding.embed_tokens.weight": "shared.weight",
            }
        self.encoder = VaswaniTransformerEncoder(config)
        self.decoder = VaswaniTransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding):
        if self.config.share_embeddings:
            self.shared = value
            self.decoder.set_input_embeddings(value)
        self.encoder.set_input_embeddings(value)

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        cache: Cache | None = None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        use_cache: bool | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        for name in ("head_mask", "decoder_head_mask", "cross_attn_head_mask"):  # (BART's, before transformers 5)
            if kwargs.get(name) is not None:
                raise ValueError(f"{name} is not supported: the model has no head masks, and would ignore it.")
        if attention_mask is None:  # the decoder's cross-attention skips the source's padding too
            attention_mask = source_padding_mask(input_ids, self.config)
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            position_ids=decoder_position_ids,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


# 3.4 Output projection and softmax -----------------------------------------------------------------------------------


class VaswaniTransformerForConditionalGeneration(VaswaniTransformerPreTrainedModel, VaswaniGenerationMixin):
    """Figure 1 whole: encoder-decoder plus the pre-softmax linear projection (tied to the embeddings)."""

    generation_config_class = VaswaniGenerationConfig  # default decoding: the paper's beam search (generation.py)

    def __init__(self, config: VaswaniTransformerConfig):
        super().__init__(config)
        self.model = VaswaniTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.share_embeddings:
            self._tied_weights_keys = {
                "lm_head.weight": "model.shared.weight",
                "model.encoder.embedding.embed_tokens.weight": "model.shared.weight",
                "model.decoder.embedding.embed_tokens.weight": "model.shared.weight",
            }
        self.post_init()

    def save_pretrained(self, *args, **kwargs):
        """transformers' saving; with remote code registered, `auto_map` also names the base model for `AutoModel`
        (transformers maps only the saved class, so `AutoModel` failed on the folder where this package is absent)."""
        if self._auto_class is not None:
            base = f"{VaswaniTransformerModel.__module__.split('.')[-1]}.{VaswaniTransformerModel.__name__}"
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), "AutoModel": base}
        return super().save_pretrained(*args, **kwargs)

    def __getstate__(self):
        """Pickled (`torch.save(model)`, `copy.deepcopy`) without the compiled calls `generate` keeps on it, as torch
        leaves out `Module.compile`'s: they cannot be pickled, and a copy kept transformers' `_compiled_call`, bound to
        the original model, whose weights the copy's compiled steps then ran. A loaded or copied model compiles its
        own when it decodes."""
        state = super().__getstate__()
        for name in COMPILED_CALLS:
            state.pop(name, None)
        return state

    def generate(self, *args, **kwargs):
        """`VaswaniGenerationMixin.generate` (the paper's beam search by default) with `packed_cpu_weights`."""
        with packed_cpu_weights():
            return super().generate(*args, **kwargs)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear):
        self.lm_head = value

    def prepare_inputs_for_generation(self, *args, **kwargs) -> dict:
        """transformers' inputs for one decoding step, with decoder positions read from the 2-D decoder mask first:
        for a static cache transformers turns that mask into a 4-D one, from which they can no longer be read."""
        mask = kwargs.get("decoder_attention_mask")
        if _is_padding_mask(mask) and kwargs.get("decoder_position_ids") is None:
            kwargs["decoder_position_ids"] = positions_from_mask(mask, mask.shape[-1])  # sliced to the step's tokens
        return super().prepare_inputs_for_generation(*args, **kwargs)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Decoder inputs for ``labels``: the one place labels are shifted (``forward``, the trainer's loss)."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        cache: Cache | None = None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        # the Trainer's count of target tokens in the update (all accumulation steps, processes): the loss is their mean
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            decoder_position_ids=decoder_position_ids,
            **kwargs,
        )
        logits = linear(self.lm_head, outputs.last_hidden_state)
        loss = None
        if labels is not None:
            # at least float32 (half-precision logits), float64 kept (a float64 model's loss and gradient checks)
            loss = nn.functional.cross_entropy(
                logits.to(torch.promote_types(logits.dtype, torch.float32)).view(-1, logits.shape[-1]),
                labels.to(logits.device).view(-1), ignore_index=-100,
                reduction="mean" if num_items_in_batch is None else "sum",
            )
            if num_items_in_batch is not None:
                count = num_items_in_batch
                loss = loss / (count.to(loss.device) if torch.is_tensor(count) else count)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )


__all__ = [
    "VaswaniTransformerPreTrainedModel",
    "VaswaniTransformerModel",
    "VaswaniTransformerForConditionalGeneration",
    "sinusoidal_position_encoding",
    "tensor2tensor_position_encoding",
]
