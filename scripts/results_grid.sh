#!/usr/bin/env bash
# The main table of docs/RESULTS.md: every paper task x epsilon 0.1 / 1 / 10 x SPPE, SPLE, NaiveNPE and the best
# classical method (DA-MCMC on regression and naive Bayes, SMC-ABC with the mechanism as kernel on SIR), seeds 0-2,
# at the library's defaults (dpsbi/configs/experiment/results.yaml), one core. Seed-major, so that a partial grid has
# whole seeds; each sweep writes a fixed directory below multirun/grid, so a killed grid resumes where it stopped
# (finished runs are skipped). SEEDS and TASKS pick a part, e.g. two cores: TASKS=sir in one job, TASKS='regression
# naive_bayes' in the other. Then: python scripts/main_grid.py collect multirun/grid --out results/main_grid.jsonl
# METHODS, EPSILONS and GRID_DIR narrow a rerun, e.g. the new flow's cells at epsilon 1 (RESULTS "The sync-free
# training step"): GRID_DIR=multirun/backend METHODS=sppe,sple EPSILONS=1 TASKS=sir SEEDS='1 2' scripts/results_grid.sh
set -euo pipefail
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 NUMBA_NUM_THREADS=1
run=${DPSBI_RUN:-.venv/bin/dpsbi-run}
for seed in ${SEEDS:-0 1 2}; do
  for task in ${TASKS:-regression naive_bayes sir}; do
    case $task in
      regression) epsilons=0.1,1,10 classical=da_mcmc ;;
      naive_bayes) epsilons=10 classical=da_mcmc ;;
      sir) epsilons=0.1,1,10 classical=smc_abc ;;
      *) echo "results_grid.sh: unknown task '$task' (regression, naive_bayes or sir)" >&2; exit 2 ;;
    esac
    [ "$task" = naive_bayes ] || epsilons=${EPSILONS:-$epsilons}
    "$run" -m experiment=results "task=$task" "task.epsilon=$epsilons" \
      "method=${METHODS:-sppe,sple,naive_npe,$classical}" "seed=$seed" progress=false trainer.threads=1 \
      "hydra.sweep.dir=${GRID_DIR:-multirun/grid}/${task}_seed${seed}" "$@"
  done
done
