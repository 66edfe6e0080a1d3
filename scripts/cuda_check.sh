#!/usr/bin/env bash
# The CUDA path for real, on a machine with an NVIDIA GPU, in one command of about 8 minutes (docs/RESULTS.md,
# "On a GPU"):
#   1. the tests that exercise the GPU (test_training_step.py counts the synchronizations of a step);
#   2. the training step on CUDA (dpsbi's flow: eager and replayed as a CUDA graph, the fits' default on CUDA, with
#      and without the fits' deterministic kernels, at 1 000 and 100 000 flow evaluations, its synchronizations
#      counted, the eager step's costliest kernels profiled) and on one CPU core (scripts/bench_step.py);
#   3. the default SPPE fit on regression at epsilon 1 on CUDA, seeds 0-2 one after the other, with one CPU core of
#      the same machine per seed fitting the same beside them from the start (CPU work only: it does not share the
#      GPU), each scored every round;
#   4. the 1000-cell census table's default SPPE fit on CUDA, 5 rounds, scored against its exact-likelihood
#      reference after each (scripts/census_scale.py; the reference computed beforehand);
#   5. SPLE's sample_batched at 500 and 2000 releases on CUDA, with its synchronizations counted
#      (scripts/bench_sple_sampling.py --releases, a posterior trained beforehand);
#   6. the amortized steps of SIR, the census table and a scalar discrete Gaussian's count (its per-row sigma by
#      table and Newton steps) at their default batch (1000) on CUDA, eager and replayed;
#   7. two candidate GPU schedules of the regression fit, seed 0: batches of 400 at twice the learning rate, and
#      4000 simulations a round in batches of 400.
# Part 3's seeds 1-2 and parts 4-7 run only while the script's budget (BUDGET seconds, default 480) has room for
# them. The GPU jobs run one at a time, so that their timings are their own. Each part has its own timeout and
# writes its result as it goes into $OUT (a new folder; default results/cuda/<date-time>), eight files, no
# subfolders:
#   log.txt  pytest.log  bench_step.jsonl  profile.txt  frontier_cuda.jsonl  frontier_cpu.jsonl  sple_batched.txt
#   census_cuda.jsonl
# (the CPU rows of the step and the CPU fits are written under /tmp and joined to theirs at the end).
# What the machine lacks comes in $PREP (default .gpu/, ignored by git, carried): wheels in whl/, the references
# cache in cache/, the SPLE posterior sple_bench.pt, the census reference in census/ (else each is made there,
# untimed but slow).
set -uo pipefail
OUT=${OUT:-results/cuda/$(date +%Y-%m-%d_%H-%M-%S)}
PREP=${PREP:-.gpu}
FIT_SECONDS=${FIT_SECONDS:-25}   # each CUDA fit's budget (no round expected to end past it is started)
CPU_FIT_SECONDS=${CPU_FIT_SECONDS:-120}
PY=${PY:-python3}
BUDGET=${BUDGET:-480}
if [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  echo "cuda_check.sh: $OUT is not empty: give OUT a new folder (frontier.py would skip the fits it holds)" >&2
  exit 2
fi
mkdir -p "$OUT"
log=$OUT/log.txt
cores=$(nproc --all)  # --all: nproc alone honours OMP_NUM_THREADS (1, below)
parts=$(mktemp -d)
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 DPSBI_CONFIG_DIR=$PWD/dpsbi/configs PYTHONPATH=$PWD
export DPSBI_CACHE=$parts/cache
mkdir -p "$DPSBI_CACHE"
[ -d "$PREP/cache" ] && cp -r "$PREP/cache/." "$DPSBI_CACHE/"
if [ -d "$PREP/whl" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$parts/site" "$PREP"/whl/*.whl \
    >>"$log" 2>&1 || echo "wheels failed" >>"$log"
  export PYTHONPATH=$parts/site:$PWD
fi
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*" | tee -a "$log"; }
room() {  # $1: a part's timeout in seconds: true if it would end within the budget, else says it is skipped
  [ $(($(date +%s) - start + $1)) -le "$BUDGET" ] && return 0
  stamp "skipped for want of time: $2"
  return 1
}
{ nvidia-smi -L; $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  lscpu | grep 'Model name'; echo "$cores cores"; } 2>&1 | tee -a "$log"
pin() {  # $1: cores, rest: the command, on those cores where the machine has 8 or more (the GPU machine has 16)
  if [ "$cores" -ge 8 ]; then taskset -c "$1" "${@:2}"; else "${@:2}"; fi
}
fit() {  # $1: cores, $2: out file, $3: seconds, rest: frontier arguments
  local on=$1 out=$2 seconds=$3; shift 3
  pin "$on" timeout -k 10 $((seconds + 60)) $PY scripts/frontier.py run --defaults --task regression --epsilon 1 \
    --method sppe --seconds "$seconds" --out "$out" "$@" >>"$log" 2>&1
  stamp "fit $* rc $?"
}
gpu_cores=0-$((cores - 5))  # the last four: the CPU fits and the CPU step
stamp "default SPPE on one CPU core per seed, and the step on another, in the background"
cpu_jobs=()
for seed in 0 1 2; do
  fit $((cores - 1 - seed)) "$parts/cpu_seed$seed.jsonl" "$CPU_FIT_SECONDS" --seeds $seed \
    --overrides '{"training": {"accelerator": "cpu"}}' &
  cpu_jobs+=($!)
done
CUDA_VISIBLE_DEVICES= pin $((cores - 4)) timeout -k 10 150 $PY scripts/bench_step.py --devices cpu \
  --backends dpsbi --sizes 100 1000 --repeats 10 --json "$parts/bench_step_cpu.jsonl" >>"$log" 2>&1 &
cpu_jobs+=($!)

stamp "1. tests on the GPU"
# 189 tests since the forty-fifth session (115 took 49 s on 8 workers in the twenty-ninth): a worker a GPU core
pin $gpu_cores timeout -k 10 110 $PY -m pytest -q -p no:cacheprovider -rfE -n $((cores >= 8 ? cores - 4 : 4)) \
  tests/test_training_step.py tests/test_inference_estimators.py tests/test_inference_posterior.py \
  tests/test_no_simulation_lost.py tests/test_parameter_space.py tests/test_importance_correction.py \
  >"$OUT/pytest.log" 2>&1
stamp "pytest rc $? ($(tail -1 "$OUT/pytest.log"))"

stamp "2. training steps on CUDA"
# replayed rows first, then compiled (35-48 s of compiling each), the eager ones (profiled) last: the twenty-ninth
# session's run of the eager rows first ran out of its 100 s before the replayed ones (and compiled none)
pin $gpu_cores timeout -k 10 150 $PY scripts/bench_step.py --devices cuda --backends dpsbi \
  --sizes 10000 100 --repeats 30 --deterministic --graph --compile-on cuda --profile "$OUT/profile.txt" \
  --json "$OUT/bench_step.jsonl" >>"$log" 2>&1
stamp "bench cuda rc $?"

stamp "3. default SPPE on CUDA, seeds 0-2"
for seed in 0 1 2; do  # seeds 1-2 only where the budget has room: parts 1-3 at their limits would pass it
  [ $seed = 0 ] || room $((FIT_SECONDS + 70)) "3. the CUDA fit of seed $seed" || break
  fit $gpu_cores "$OUT/frontier_cuda.jsonl" "$FIT_SECONDS" --seeds $seed
done

room 100 "4. the census fit" && {
  stamp "4. the 1000-cell census table's default SPPE fit on CUDA, 5 rounds"
  pin $gpu_cores timeout -k 10 95 $PY scripts/census_scale.py run --cells 1000 --embeddings none \
    --overrides '{"rounds": 5}' --work "$PREP/census" --out "$OUT/census_cuda.jsonl" >>"$log" 2>&1
  stamp "census rc $?"
}

for releases in 500 2000; do
  seconds=$((releases / 20 + 20))  # 15 s at 500 on an H200 (twenty-ninth session), and a warm-up at two
  room $((seconds + 5)) "5. sample_batched at $releases releases" && {
    stamp "5. SPLE's sample_batched on CUDA at $releases releases"
    pin $gpu_cores timeout -k 10 $seconds $PY scripts/bench_sple_sampling.py --posterior "$PREP/sple_bench.pt" \
      --releases $releases --samples 1000 --looped 0 --device cuda >>"$OUT/sple_batched.txt" 2>&1
    stamp "sple batched $releases rc $?"
  }
done

for step in sir_amortized census_amortized count_amortized; do
  room 30 "6. the $step step" && {
    stamp "6. the $step step on CUDA"  # a bare --compile-on: none compiled (35-48 s each would not fit in 30 s)
    pin $gpu_cores timeout -k 10 30 $PY scripts/bench_step.py --step $step --devices cuda --backends dpsbi \
      --sizes 1000 --repeats 20 --deterministic --graph --compile-on --json "$OUT/bench_step.jsonl" >>"$log" 2>&1
    stamp "bench $step rc $?"
  }
done

for overrides in '{"training": {"batch_size": 400, "lr": 0.002}}' \
  '{"sims_per_round": 4000, "training": {"batch_size": 400}}'; do
  room $((FIT_SECONDS + 40)) "7. the schedule $overrides" && {
    stamp "7. a candidate GPU schedule, seed 0: $overrides"
    fit $gpu_cores "$OUT/frontier_cuda.jsonl" "$FIT_SECONDS" --seeds 0 --overrides "$overrides"
  }
done

for job in "${cpu_jobs[@]}"; do wait "$job"; done
cat "$parts"/cpu_seed*.jsonl >"$OUT/frontier_cpu.jsonl" 2>/dev/null
cat "$parts/bench_step_cpu.jsonl" >>"$OUT/bench_step.jsonl" 2>/dev/null
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >>"$log" 2>&1
stamp "done"
sed -i "s#$PWD/##g; s#$parts/##g" "$OUT"/*.txt "$OUT"/*.log  # the logs get committed: no path of this machine
