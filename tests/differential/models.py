"""Models for the differential test: the examples, small Hugging Face configs, and hand-written ones.

Every builder returns ``(model, example_inputs)`` in eval mode, seeded, small enough to run on
four CPU ranks in well under a second, with every batch, sequence, hidden and head count
divisible by 4 so that plans really shard. Language models and classifiers get labels with
some -100 entries where the library computes a loss (a causal LM also shifts its labels and
pads each row with -100), so token-sharded losses see unequal counts of valid targets.

Beyond the issue's families (examples, Mistral, Qwen2, Mixtral, Qwen2-MoE, Phi-3, Gemma-2, T5,
BART, ViT, ResNet), ``make fuzz`` also runs GPT-NeoX, OPT, BLOOM, Falcon, GPT-J, DistilBERT
(masked LM), RoBERTa (sequence classification), ConvNeXt, Swin and DeiT.

torchvision 0.28.0 (the release matching torch 2.13.0) does not import with the CPU build of
torch (its ``_C.so`` links ``libtorch_cuda.so``), so its ResNet-18 and ViT are stood in for by
``resnet`` (torchvision's BasicBlock structure: ``nn.ReLU(inplace=True)`` and ``out += identity``)
and ``vit`` (patchify convolution, class token, ``nn.TransformerEncoderLayer``), plus Hugging
Face's ResNet and ViT.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from autoshard.frontend.load import load_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_NAMES = ("attention", "cnn", "cnn_loss", "gpt2", "bert", "llama")
"""Examples run as their files build them; ``mlp`` (x [8, 1024, 1024], minutes on CPU ranks) runs at 16 -> 32 -> 16."""
BATCH, SEQ, VOCAB = 4, 8, 64

Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


class InPlaceMLP(nn.Module):
    """The issue's minimal model: an in-place mask between two linears, plus the other in-place spellings."""

    def __init__(self, hidden: int = 16, inner: int = 32) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, inner), nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h.masked_fill_(mask, 0.0)
        h += 1.0
        h.mul_(0.5)
        torch.relu_(h)
        y = self.fc2(h)
        F.relu(y, inplace=True)  # the result is not assigned: only the mutation says y changed
        return y


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: conv-bn-relu(inplace), conv-bn, ``out += identity``, relu(inplace)."""

    def __init__(self, channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample = None
        if stride != 1 or channels != out_channels:
            self.downsample = nn.Sequential(nn.Conv2d(channels, out_channels, 1, stride, bias=False),
                                            nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class SmallResNet(nn.Module):
    """ResNet-18's structure at 1 block per stage and 8-32 channels, with batch norm statistics set."""

    def __init__(self, classes: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(2)
        self.layer1, self.layer2 = BasicBlock(8, 8, 1), BasicBlock(8, 16, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class SmallViT(nn.Module):
    """torchvision's VisionTransformer structure: patchify conv, class token, position embedding, encoder, head."""

    def __init__(self, image: int = 16, patch: int = 4, hidden: int = 32, classes: int = 8) -> None:
        super().__init__()
        self.conv_proj = nn.Conv2d(3, hidden, patch, patch)
        self.class_token = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)
        self.pos_embedding = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, hidden) * 0.02)
        self.encoder = nn.TransformerEncoderLayer(hidden, 4, 2 * hidden, dropout=0.0, batch_first=True,
                                                  norm_first=True)
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        return self.head(self.ln(self.encoder(x))[:, 0])


class WithLabels(nn.Module):
    """A Hugging Face model called as ``model(**{input_name: inputs, "labels": labels})``: the loss is in the graph."""

    def __init__(self, model: nn.Module, input_name: str) -> None:
        super().__init__()
        self.model, self.input_name = model, input_name

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> Any:
        return self.model(**{self.input_name: inputs, "labels": labels})


def token_labels(generator: torch.Generator) -> torch.Tensor:
    """Labels [BATCH, SEQ] with -100 at uneven places: a prompt masked in row 0, padding in row 2."""
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    labels[0, :3] = -100
    labels[2, -2:] = -100
    return labels


def _seeded(build: Callable[[torch.Generator], Built]) -> Callable[[], Built]:
    def seeded() -> Built:
        torch.manual_seed(0)
        model, inputs = build(torch.Generator().manual_seed(1))
        return model.eval(), inputs
    return seeded


def _decoder_only(config_name: str, model_name: str, **extra: Any) -> Callable[[], Built]:
    """A Hugging Face ``*ForCausalLM`` with 2 layers, hidden 32, 4 heads (2 key/value heads), labels given."""
    def build(generator: torch.Generator) -> Built:
        import transformers
        config = getattr(transformers, config_name)(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2 * SEQ, use_cache=False, attn_implementation="eager",
            pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)
        model = getattr(transformers, model_name)(config)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
        return WithLabels(model, "input_ids"), (ids, token_labels(generator))
    return _seeded(build)


def _seq2seq(config_name: str, model_name: str, **config: Any) -> Callable[[], Built]:
    """A Hugging Face encoder-decoder given ``input_ids`` and ``labels`` (decoder inputs are the shifted labels)."""
    def build(generator: torch.Generator) -> Built:
        import transformers
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(
            vocab_size=VOCAB, use_cache=False, attn_implementation="eager", pad_token_id=0, eos_token_id=2,
            decoder_start_token_id=0, **config))
        ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=generator)
        return WithLabels(model, "input_ids"), (ids, token_labels(generator))
    return _seeded(build)


def _language_model(config_name: str, model_name: str, **config: Any) -> Callable[[], Built]:
    """Any other Hugging Face language model head (causal or masked LM) given ``input_ids`` and token labels."""
    def build(generator: torch.Generator) -> Built:
        import transformers
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(
            vocab_size=VOCAB, use_cache=False, attn_implementation="eager", pad_token_id=0, bos_token_id=1,
            eos_token_id=2, **config))
        ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=generator)
        return WithLabels(model, "input_ids"), (ids, token_labels(generator))
    return _seeded(build)


def _sequence_classifier(config_name: str, model_name: str, **config: Any) -> Callable[[], Built]:
    """A Hugging Face sequence classifier with 4 classes; one sequence's label is -100."""
    def build(generator: torch.Generator) -> Built:
        import transformers
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(
            vocab_size=VOCAB, attn_implementation="eager", pad_token_id=0, num_labels=4, **config))
        ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=generator)
        return WithLabels(model, "input_ids"), (ids, torch.tensor([1, -100, 3, 0]))
    return _seeded(build)


def _image_classifier(config_name: str, model_name: str, size: int = 16, **config: Any) -> Callable[[], Built]:
    """A Hugging Face image classifier on [BATCH, 3, size, size] images with 8 labels, one of them -100."""
    def build(generator: torch.Generator) -> Built:
        import transformers
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(num_labels=8, **config))
        images = torch.randn(BATCH, 3, size, size, generator=generator)
        labels = torch.tensor([3, -100, 5, 1])
        return WithLabels(model, "pixel_values"), (images, labels)
    return _seeded(build)


def _example(name: str) -> Callable[[], Built]:
    def build() -> Built:
        loaded = load_model(str(EXAMPLES / f"{name}.py"))
        return loaded.model.eval(), loaded.example_inputs
    return build


def _hand_written(cls: type[nn.Module], *shape: int, mask: bool = False) -> Callable[[], Built]:
    def build(generator: torch.Generator) -> Built:
        x = torch.randn(*shape, generator=generator)
        if not mask:
            return cls(), (x,)
        return cls(), (x, torch.rand(*shape[:-1], 32, generator=generator) > 0.5)
    return _seeded(build)


def _small_mlp(generator: torch.Generator) -> Built:
    from tests.runtime.plans import MLP
    return MLP(), (torch.randn(BATCH, SEQ, 16, generator=generator),)


MODELS: dict[str, Callable[[], Built]] = {
    "mlp": _seeded(_small_mlp),
    **{name: _example(name) for name in EXAMPLE_NAMES},
    "inplace_mlp": _hand_written(InPlaceMLP, BATCH, SEQ, 16, mask=True),
    "resnet": _hand_written(SmallResNet, BATCH, 3, 16, 16),
    "vit": _hand_written(SmallViT, BATCH, 3, 16, 16),
    "mistral": _decoder_only("MistralConfig", "MistralForCausalLM", sliding_window=None),
    "qwen2": _decoder_only("Qwen2Config", "Qwen2ForCausalLM"),
    "mixtral": _decoder_only("MixtralConfig", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": _decoder_only("Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=32, shared_expert_intermediate_size=64),
    "phi3": _decoder_only("Phi3Config", "Phi3ForCausalLM"),
    "gemma2": _decoder_only("Gemma2Config", "Gemma2ForCausalLM", head_dim=8, query_pre_attn_scalar=8),
    "t5": _seq2seq("T5Config", "T5ForConditionalGeneration", d_model=32, d_kv=8, d_ff=64, num_layers=1,
                   num_heads=4),
    "bart": _seq2seq("BartConfig", "BartForConditionalGeneration", d_model=32, encoder_layers=1, decoder_layers=1,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                     max_position_embeddings=2 * SEQ),
    "hf_vit": _image_classifier("ViTConfig", "ViTForImageClassification", image_size=16, patch_size=4,
                                hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64),
    "hf_resnet": _image_classifier("ResNetConfig", "ResNetForImageClassification", embedding_size=8,
                                   hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"),
    # beyond the families, for make fuzz
    "gpt_neox": _language_model("GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_size=32, num_hidden_layers=1,
                                num_attention_heads=4, intermediate_size=64, max_position_embeddings=2 * SEQ),
    "opt": _language_model("OPTConfig", "OPTForCausalLM", hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                           ffn_dim=64, max_position_embeddings=2 * SEQ, word_embed_proj_dim=32),
    "bloom": _language_model("BloomConfig", "BloomForCausalLM", hidden_size=32, n_layer=1, n_head=4),
    "falcon": _language_model("FalconConfig", "FalconForCausalLM", hidden_size=32, num_hidden_layers=1,
                              num_attention_heads=4, new_decoder_architecture=False),
    "gptj": _language_model("GPTJConfig", "GPTJForCausalLM", n_embd=32, n_layer=1, n_head=4, rotary_dim=4,
                            n_positions=2 * SEQ),
    "distilbert": _language_model("DistilBertConfig", "DistilBertForMaskedLM", dim=32, n_layers=1, n_heads=4,
                                  hidden_dim=64, max_position_embeddings=2 * SEQ),
    "roberta": _sequence_classifier("RobertaConfig", "RobertaForSequenceClassification", hidden_size=32,
                                    num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                    max_position_embeddings=4 * SEQ),
    "convnext": _image_classifier("ConvNextConfig", "ConvNextForImageClassification", size=32, hidden_sizes=[8, 16],
                                  depths=[1, 1], num_stages=2),
    "swin": _image_classifier("SwinConfig", "SwinForImageClassification", size=32, image_size=32, patch_size=4,
                              embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4),
    "deit": _image_classifier("DeiTConfig", "DeiTForImageClassification", size=32, image_size=32, patch_size=8,
                              hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64),
}
"""Every model of the differential test by name."""
