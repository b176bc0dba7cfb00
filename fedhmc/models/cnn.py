"""The built-in convolutional network: ``--model cnn``, a LeNet-5 (LeCun et al. 1998).

The layout of the FA-LD authors' experiment code: two 5×5 convolutions with ReLU and 2×2
max-pooling (6 and 16 channels), then fully connected layers of 120 and 84 units and the
class layer. It is an ordinary ``nn.Module`` sampled through the generic ``torch.func``
path (``fedhmc.models.module.TorchModel``); it takes images (B, C, H, W) or the same
images flattened (B, C·H·W).
"""

from __future__ import annotations

import torch
from torch import nn


class LeNet5(nn.Module):
    """LeNet-5 for images of shape ``in_shape`` = (channels, height, width).

    The first convolution pads by 2 (28×28 stays 28×28, as in the classic MNIST variant);
    the second pads by 2 too when the image is too small for an unpadded 5×5 window after
    the first pooling (8×8 digits), so that any image of at least 4×4 pixels fits.
    """

    def __init__(self, in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10):
        super().__init__()
        c, h, w = (int(v) for v in in_shape)
        if min(h, w) < 4:
            raise ValueError(f"LeNet-5 needs images of at least 4×4 pixels, got {h}×{w}")
        self.in_shape = (c, h, w)
        pad2 = 0 if min(h, w) // 2 >= 5 else 2
        self.conv1 = nn.Conv2d(c, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5, padding=pad2)
        h2 = (h // 2 + 2 * pad2 - 4) // 2
        w2 = (w // 2 + 2 * pad2 - 4) // 2
        self.fc1 = nn.Linear(16 * h2 * w2, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, *self.in_shape)
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def lenet5(in_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 10) -> LeNet5:
    """The factory behind ``--model cnn`` (also ``--model fedhmc.models.cnn:lenet5``)."""
    return LeNet5(tuple(in_shape), int(num_classes))
