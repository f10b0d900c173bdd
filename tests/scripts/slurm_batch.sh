#!/bin/bash
# The batch script of the SLURM recipe (docs/integrations.md, "On SLURM and Kubernetes"):
# with `#SBATCH --signal=B:TERM@120` SLURM signals this shell alone, ahead of the time limit,
# and the shell hands the signal on to the launcher alone. wandb-core, which a SIGTERM stops at
# once, dropping the records it has not written yet, runs on until the script's teardown has
# ended the run. Usage: slurm_batch.sh COMMAND...
trap 'kill -TERM "$child" 2>/dev/null; forwarded=1' TERM
"$@" &
child=$!
wait "$child"
status=$?
if [ -n "${forwarded:-}" ]; then
    wait "$child"  # the first wait returned when the trap ran: now the launcher's own end
    status=$?
fi
exit "$status"
