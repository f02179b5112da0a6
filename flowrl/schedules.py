"""Learning-rate schedules shared by training and the pretraining recipes."""
from __future__ import annotations

import math


def cosine_decay(step: int, total: int) -> float:
    """0.5 (1 + cos(pi step / total)): 1 at step 0, 0 at step `total`."""
    return 0.5 * (1 + math.cos(math.pi * step / total))
