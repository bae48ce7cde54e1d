"""Cross entropy with label smoothing, averaged over the batch; the logits' shape is
derived from the number of classes at import."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Mean over rows of (1 - s) * nll(target) + s * mean over classes of nll(class)."""

    def __init__(self, smoothing: float) -> None:
        super().__init__()
        self.smoothing = smoothing

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """logits: (batch_size, num_classes); labels: (batch_size,) int64. Returns a
        0-dim tensor."""
        return F.cross_entropy(logits, labels, label_smoothing=self.smoothing)


batch_size = 16384
num_classes = 8192
logit_shape = (num_classes,)
smoothing = 0.1


def get_inputs() -> list[torch.Tensor]:
    return [
        torch.randn(batch_size, *logit_shape) * 2,
        torch.randint(0, num_classes, (batch_size,)),
    ]


def get_init_inputs() -> list:
    return [smoothing]
