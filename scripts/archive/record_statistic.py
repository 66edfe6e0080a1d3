"""``RegressionRecords.statistic`` (one batched product over the records) against the sum of the records' shares
(``contribution``, each record alone: the statistic's path until the forty-seventh session), at 100 000 datasets of
442 records (REAL_DATA's reference batch) on one torch thread: ``python scripts/archive/record_statistic.py new`` or
``... old``, one process each (RESULTS, "A record model's statistic in one product"). Prints the seconds of the
statistic alone (the records' sampling excluded) and the statistics' sum, equal for both."""

from __future__ import annotations

import sys
import time

import torch

from dpsbi.baselines.records import RegressionRecords

torch.set_num_threads(1)
records = RegressionRecords(torch.zeros(3), torch.ones(3), n=442, x_mean=(0.0, 0.0), noise_var=0.6, bound=2.0)
generator = torch.Generator().manual_seed(0)
drawn = records.sample(torch.randn(100_000, 3, generator=generator), generator)
start = time.perf_counter()
statistic = records.statistic(drawn) if sys.argv[1] == "new" else records.contribution(drawn).sum(-2)
print(sys.argv[1], round(time.perf_counter() - start, 2), "s", float(statistic.sum()))
