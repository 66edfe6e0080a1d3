"""C2ST of 2000 draws resampled with replacement from a pool of exact draws (uniform weights: the best case of an
importance sampler) against 2000 fresh exact draws: the floor that repeated draws put under a corrected C2ST."""

import json

import torch

from dpsbi.metrics import c2st

torch.set_num_threads(1)
for pool in (10_000, 50_000, 100_000):
    scores = []
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        exact = torch.randn(pool, 3, generator=g)
        idx = torch.randint(pool, (2000,), generator=g)
        fresh = torch.randn(2000, 3, generator=g)
        scores.append(round(c2st(exact[idx], fresh), 4))
    print(
        json.dumps({"pool": pool, "draws": 2000, "c2st": scores, "mean": round(sum(scores) / 5, 4)}),
        flush=True,
    )
