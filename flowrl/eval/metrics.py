"""Small metrics the evaluation suites and recipes share."""

from __future__ import annotations

import torch


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties); nan when a class is missing."""
    from scipy.stats import rankdata

    scores, labels = scores.flatten().double().numpy(), labels.flatten().bool().numpy()
    positives, negatives = labels.sum(), (~labels).sum()
    if positives == 0 or negatives == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))
