"""The user's own module, given to dpaudit by factory: ``examples.byo_cifar_shaped.model:resnet``.

A small residual CNN (He et al. 2016, arXiv:1512.03385) with GroupNorm instead of BatchNorm (Wu & He
2018, arXiv:1803.08494): BatchNorm mixes the examples of a batch, which per-example clipping cannot
bound, so DP-SGD practice (e.g. De et al. 2022, arXiv:2204.13650) uses GroupNorm. Nothing here knows
about dpaudit: it is an ordinary ``nn.Module`` factory.
"""

from __future__ import annotations

from torch import nn


class Block(nn.Module):
    """conv3x3-GN-ReLU-conv3x3-GN plus the identity (or a 1x1 strided projection), then ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(groups, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(groups, c_out)
        self.act = nn.ReLU()
        self.shortcut = (
            nn.Identity() if stride == 1 and c_in == c_out else nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)
        )

    def forward(self, x):
        h = self.act(self.norm1(self.conv1(x)))
        return self.act(self.norm2(self.conv2(h)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, in_channels: int, widths: list[int], n_classes: int, groups: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False), nn.GroupNorm(groups, widths[0]), nn.ReLU()
        )
        blocks, c = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(Block(c, w, stride=1 if i == 0 else 2, groups=groups))
            c = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c, n_classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def resnet(
    in_channels: int = 3, widths: tuple[int, ...] = (16, 32, 64), n_classes: int = 10, groups: int = 4
) -> nn.Module:
    """A residual CNN for (B, in_channels, H, W) images -> (B, n_classes) logits."""
    return ResNet(in_channels, list(widths), n_classes, groups)
