#!/usr/bin/env bash
# The CUDA path for real, on a machine with an NVIDIA GPU, in one command of at most ~8 minutes (docs/RESULTS.md,
# "On a GPU"):
#   1. the tests that exercise the GPU (test_training_step.py counts the synchronizations of a step);
#   2. the training step on CUDA and on one CPU core, both flow backends, eager and replayed as a CUDA graph
#      (cuda_graph, the fits' default on CUDA), with and without the fits' deterministic kernels, at 1 000 and
#      100 000 flow evaluations, with its synchronizations counted (scripts/bench_step.py);
#   3. the default SPPE fit on regression at epsilon 1 on CUDA (its step a CUDA graph), with one CPU core of the
#      same machine fitting the same beside it from the start (CPU work only: it does not share the GPU), each
#      scored every round; then on CUDA with 2000 simulations a round in batches of 200 (a candidate GPU schedule);
#   4. SPLE's sample_batched at 500 releases on CUDA, every release's chains in one run, against one run per
#      release (scripts/bench_sple_sampling.py --releases).
# The GPU jobs run one at a time, so that their timings are their own. Each part has its own timeout and writes
# its result as it goes, straight into $OUT (a new folder; default results/cuda/<date-time>), no subfolders:
#   log.txt  pytest.log  bench_step.jsonl  bench_step_cpu.jsonl  frontier_cuda_sppe.jsonl  frontier_cpu_sppe.jsonl
#   frontier_cuda_sppe_2000x200.jsonl (or frontier_cuda_sppe_eager.jsonl)  bench_sple_sampling.txt
# Packages the machine lacks can come as wheels in .whl/ (installed into /tmp/site first); a reference cache made
# here can come in .dpsbi_cache/ (else the fits compute the reference first, untimed).
set -uo pipefail
OUT=${OUT:-results/cuda/$(date +%Y-%m-%d_%H-%M-%S)}
FIT_SECONDS=${FIT_SECONDS:-55}   # each CUDA fit's budget (rounds are scored beyond it); the CPU fit's: 270 s
TEST_SECONDS=${TEST_SECONDS:-95}
BENCH_SECONDS=${BENCH_SECONDS:-75}
if [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  echo "cuda_check.sh: $OUT is not empty: give OUT a new folder (frontier.py would skip the fits it holds)" >&2
  exit 2
fi
mkdir -p "$OUT"
log=$OUT/log.txt
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 DPSBI_CONFIG_DIR=$PWD/dpsbi/configs PYTHONPATH=$PWD
export DPSBI_CACHE=/tmp/dpsbi_cache
[ -d .dpsbi_cache ] && cp -r .dpsbi_cache /tmp/dpsbi_cache
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    >>"$log" 2>&1 || echo "wheels failed" >>"$log"
  export PYTHONPATH=/tmp/site:$PWD
fi
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*" | tee -a "$log"; }
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  lscpu | grep 'Model name'; } 2>&1 | tee -a "$log"

fit() {  # $1: file stem, $2: seconds, rest: frontier arguments
  local stem=$1 seconds=$2; shift 2
  timeout -k 10 $((seconds + 45)) python3 scripts/frontier.py run --defaults --task regression --epsilon 1 \
    --seconds "$seconds" --out "$OUT/$stem.jsonl" "$@" >>"$log" 2>&1
  stamp "$stem rc $?"
}
stamp "default SPPE and the step on one CPU core each, in the background until the end"
fit frontier_cpu_sppe 270 --method sppe --overrides '{"training": {"accelerator": "cpu"}}' &
cpu_fit=$!
CUDA_VISIBLE_DEVICES= timeout -k 10 120 python3 scripts/bench_step.py --devices cpu --sizes 100 1000 --repeats 10 \
  --json "$OUT/bench_step_cpu.jsonl" >>"$log" 2>&1 &
cpu_bench=$!

stamp "tests on the GPU"
timeout -k 10 "$TEST_SECONDS" python3 -m pytest -q -p no:cacheprovider -rfE -n 8 tests/test_training_step.py \
  tests/test_inference_estimators.py tests/test_inference_posterior.py tests/test_no_simulation_lost.py \
  >"$OUT/pytest.log" 2>&1
stamp "pytest rc $? ($(tail -1 "$OUT/pytest.log"))"

stamp "training steps, CUDA then one CPU core"
timeout -k 10 "$BENCH_SECONDS" python3 scripts/bench_step.py --devices cuda --sizes 100 10000 --repeats 30 \
  --deterministic --graph --compile-on \
  --json "$OUT/bench_step.jsonl" >>"$log" 2>&1
stamp "bench cuda rc $?"

stamp "default SPPE on CUDA, its step a CUDA graph"
fit frontier_cuda_sppe "$FIT_SECONDS" --method sppe
if [ -s "$OUT/frontier_cuda_sppe.jsonl" ]; then
  stamp "SPPE on CUDA, 2000 simulations a round in batches of 200"
  fit frontier_cuda_sppe_2000x200 "$FIT_SECONDS" --method sppe \
    --overrides '{"sims_per_round": 2000, "training": {"batch_size": 200}}'
else  # the graphed fit failed: time the eager one instead
  stamp "default SPPE on CUDA, eager"
  fit frontier_cuda_sppe_eager "$FIT_SECONDS" --method sppe --overrides '{"training": {"cuda_graph": false}}'
fi
stamp "SPLE's sample_batched at 500 releases on CUDA"
timeout -k 10 45 python3 scripts/bench_sple_sampling.py --posterior /tmp/sple_bench.pt --releases 500 \
  --samples 1000 --device cuda >"$OUT/bench_sple_sampling.txt" 2>&1
stamp "bench sple rc $?"
wait "$cpu_bench"
stamp "bench cpu rc $?"
wait "$cpu_fit"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >>"$log" 2>&1
stamp "done"
sed -i "s#$PWD/##g" "$OUT"/*.log "$OUT"/log.txt  # the logs get committed: no path of this machine in them
