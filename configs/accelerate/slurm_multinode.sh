#!/usr/bin/env bash
# A multi-node flowrl run under SLURM: one task per node, each launching its GPUs with accelerate; the first node of
# the allocation is the rendezvous. Submit with: sbatch configs/accelerate/slurm_multinode.sh configs/real/X.yaml
#SBATCH --job-name=flowrl
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --output=%x-%j.out
set -euo pipefail
CONFIG=${1:?usage: sbatch configs/accelerate/slurm_multinode.sh RUN_CONFIG [key=value ...]}
shift
ARGS=$(printf '%q ' "$CONFIG" "$@")  # overrides such as algorithm={name: awm} keep their spaces through bash -c
MAIN_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
GPUS_PER_NODE=${SLURM_GPUS_ON_NODE:-8}
# srun starts one launcher per node; SLURM_NODEID is that node's rank. The run folder must be on a shared filesystem.
srun bash -c "accelerate launch --config_file configs/accelerate/multinode.yaml \
    --num_machines $SLURM_NNODES --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) \
    --machine_rank \$SLURM_NODEID --main_process_ip $MAIN_IP --main_process_port 29500 \
    -m flowrl train $ARGS"
