#!/usr/bin/env bash
# The CUDA path for real, on a machine with an NVIDIA GPU, in one command of at most ~8 minutes (docs/RESULTS.md,
# "On a GPU"): the tests that exercise the GPU, one training step on the CPU and on CUDA (scripts/bench.py), the
# default SPPE fit on regression at epsilon 1 on CUDA beside the same fit on one CPU core of that machine, and the
# paper preset (dpsbi-run experiment=paper) on CUDA cut after SECONDS_PER_FIT + 30 s. One GPU job at a time, so
# that the GPU timings are its own. Each part has its own timeout and writes its result as it goes, straight into
# $OUT (a new folder; default results/cuda/<date-time>; six files, none in a subfolder):
#   log.txt  pytest.log  bench.json  frontier_cuda_sppe.jsonl  frontier_cpu_sppe.jsonl  paper_rounds.json
# Packages the machine lacks can come as wheels in .whl/ (installed into /tmp/site first).
set -uo pipefail
OUT=${OUT:-results/cuda/$(date +%Y-%m-%d_%H-%M-%S)}
SECONDS_PER_FIT=${SECONDS_PER_FIT:-80}  # each fit's budget (the paper preset is cut 30 s after)
TEST_SECONDS=${TEST_SECONDS:-150}        # the first run's tests took 92 s on 12 workers
BENCH_SECONDS=${BENCH_SECONDS:-60}
if [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  echo "cuda_check.sh: $OUT is not empty: give OUT a new folder (frontier.py would skip the fits it holds)" >&2
  exit 2
fi
mkdir -p "$OUT"
rm -rf /tmp/paper  # a paper run left by an earlier call would resume instead of being timed
log=$OUT/log.txt
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 DPSBI_CACHE=/tmp/dpsbi_cache DPSBI_CONFIG_DIR=$PWD/configs
export PYTHONPATH=$PWD
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    >>"$log" 2>&1 || echo "wheels failed" >>"$log"
  export PYTHONPATH=/tmp/site:$PWD
fi
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*" | tee -a "$log"; }
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  lscpu | grep 'Model name'; } 2>&1 | tee -a "$log"

stamp "tests on the GPU"
timeout -k 10 "$TEST_SECONDS" python3 -m pytest -q -p no:cacheprovider -rfE -n 8 tests/test_mcmc.py \
  tests/test_sir_simulator.py tests/test_inference_estimators.py tests/test_inference_posterior.py \
  tests/test_no_simulation_lost.py tests/test_amortized.py tests/test_inference_reliability.py >"$OUT/pytest.log" 2>&1
stamp "pytest rc $? ($(tail -1 "$OUT/pytest.log"))"

stamp "training steps, CPU and CUDA"
timeout -k 10 "$BENCH_SECONDS" python3 scripts/bench.py --tasks regression --rounds 1 --sims 200 --max-epochs 3 \
  --repeats 5 --json "$OUT/bench.json" >>"$log" 2>&1
stamp "bench rc $?"

fit() {  # $1: file stem, rest: frontier arguments
  local stem=$1; shift
  timeout -k 10 $((SECONDS_PER_FIT + 60)) python3 scripts/frontier.py run --defaults --task regression --epsilon 1 \
    --seconds "$SECONDS_PER_FIT" --out "$OUT/$stem.jsonl" "$@" >>"$log" 2>&1
  stamp "$stem rc $?"
}
stamp "default SPPE on CUDA, and on one CPU core beside it"
fit frontier_cpu_sppe --method sppe --overrides '{"training": {"accelerator": "cpu"}}' &
cpu_fit=$!
fit frontier_cuda_sppe --method sppe
wait "$cpu_fit"

stamp "the paper preset on CUDA"
timeout -k 10 "$((SECONDS_PER_FIT + 30))" python3 -c 'import sys; from dpsbi.cli import run; sys.argv[0] = "dpsbi-run"; run()' \
  experiment=paper task=regression task.epsilon=1 method=sppe companions=[] trainer=cuda trainer.threads=1 \
  progress=false hydra.run.dir=/tmp/paper >>"$log" 2>&1
stamp "paper rc $?"
cp /tmp/paper/sppe/rounds.json "$OUT/paper_rounds.json" 2>/dev/null
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >>"$log" 2>&1
stamp "done"
sed -i "s#$PWD/##g" "$OUT"/*.log "$OUT"/log.txt  # the logs get committed: no path of this machine in them
