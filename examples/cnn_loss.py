"""The small CNN with its cross-entropy loss in the graph: inputs (images [8, 3, 32, 32], labels [8]).

Shows the ``build()`` form of the model-file convention and a sibling import (the loader puts the
model file's folder on ``sys.path`` while loading it).
"""

import torch
from torch import nn

from cnn import SmallCNN


class WithCrossEntropy(nn.Module):
    """Classifier followed by ``F.cross_entropy`` (mean over the batch)."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier
        self.loss = nn.CrossEntropyLoss()

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(self.classifier(images), labels)


def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A deterministic CNN + loss and a labelled batch."""
    torch.manual_seed(0)
    model = WithCrossEntropy(SmallCNN())
    return model, (torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))
