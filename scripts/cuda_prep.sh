#!/usr/bin/env bash
# What scripts/cuda_check.sh needs that the GPU machine lacks, made here into $PREP (default .gpu/, ignored by git),
# about 6 minutes on one core: the wheels of the packages its image does not hold (for its Python 3.12; pure-Python
# wheels built from sdists where PyPI has none), the regression reference at epsilon 1 (scripts/frontier.py's
# cache), a trained SPLE posterior for scripts/bench_sple_sampling.py, and the 1000-cell census table's reference
# (scripts/census_scale.py). Then, on the GPU machine, with $PREP carried:
#   BUDGET=470 bash scripts/cuda_check.sh    (a device call of 560 s: the machine's start comes on top)
set -euo pipefail
PREP=${PREP:-.gpu}
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1
grep -qx "/$PREP/" .git/info/exclude 2>/dev/null || echo "/$PREP/" >>.git/info/exclude
mkdir -p "$PREP/whl" "$PREP/cache" "$PREP/census"
pins() { "$PY" -m pip list --format=freeze 2>/dev/null | grep -i -E "^($(echo "$@" | tr ' ' '|'))==" ; }
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$PREP/whl" \
  $(pins arviz h5netcdf hydra-core hydra-joblib-launcher omegaconf sbi zuko xarray-einstats platformdirs skorch)
"$PY" -m pip wheel -q --no-deps -w "$PREP/whl" $(pins antlr4-python3-runtime nflows)
DPSBI_CACHE=$PREP/cache "$PY" scripts/frontier.py run --defaults --task regression --epsilon 1 --method sppe \
  --overrides '{"rounds": 1, "training": {"max_steps": 1}}' --out "$PREP/cache/prep.jsonl"
[ -f "$PREP/sple_bench.pt" ] || "$PY" scripts/bench_sple_sampling.py --posterior "$PREP/sple_bench.pt" \
  --releases 2 --samples 100 --looped 0
"$PY" scripts/census_scale.py run --cells 1000 --embeddings none \
  --overrides '{"rounds": 1, "training": {"max_steps": 1}}' --work "$PREP/census" --out "$PREP/census/prep.jsonl"
du -sh "$PREP"
