"""Small image classifier: two conv2d + ReLU + max_pool2d stages, flatten, linear (images [8, 3, 32, 32])."""

import torch
from torch import nn


class SmallCNN(nn.Module):
    """conv(3->16) relu pool, conv(16->32) relu pool, flatten, linear to 10 classes."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(32 * 8 * 8, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.conv1(images)))
        x = self.pool(self.relu(self.conv2(x)))
        return self.fc(self.flatten(x))


torch.manual_seed(0)
model = SmallCNN()
example_inputs = (torch.randn(8, 3, 32, 32),)
