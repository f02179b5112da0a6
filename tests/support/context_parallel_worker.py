"""Under torchrun on 2 gloo processes: a tiny Wan policy's velocities, rollout latents and log-probs, and GRPO's
re-scored log-probs of that rollout, first on each process alone and then with the two sharing every clip's tokens
(Ulysses context parallelism); rank 0 saves both sets. argv: the output file."""

import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from tiny_pipelines import tiny_wan

from flowrl.devices import end_processes
from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.policies.placement import enable_context_parallel
from flowrl.rollout import rollout, sample_generators


def measured(policy) -> dict[str, torch.Tensor]:
    """The numbers compared, and how many tokens the first block's feed-forward saw per sample (its share)."""
    tokens = []
    hook = policy.transformer.blocks[0].ffn.register_forward_pre_hook(lambda _, args: tokens.append(args[0].shape[1]))
    cond = policy.encode(["a red circle moving left", "a blue square"], 3.0)
    shape = policy.noise_shape(SampleSpec(16, 16, 5))
    traj = rollout(policy, cond, sample_generators([5, 6]), shape, 4, "flow", 0.7, 3.0)
    with torch.no_grad():
        x, sigma, sigma_next = traj.latents[1], traj.sigmas[1].repeat(2), traj.sigmas[2].repeat(2)
        rescored = policy.step("flow", x, sigma, sigma_next, cond, 3.0, 0.7, prev_sample=traj.latents[2])[3]
        velocity = policy.velocity(traj.latents[0], traj.sigmas[0].repeat(2), cond, 3.0)
    hook.remove()
    measures = {"velocity": velocity, "latents": traj.latents, "log_probs": traj.log_probs, "rescored": rescored}
    measures["tokens"] = torch.tensor(tokens)
    return {name: value.contiguous() for name, value in measures.items()}


if __name__ == "__main__":
    torch.set_num_threads(1)
    # diffusers 0.42 picks a device index as rank % torch.accelerator.device_count(), which is 0 on a machine without
    # an accelerator; the CPU processes here have one device each
    torch.accelerator.device_count = lambda: 1
    dist.init_process_group("gloo")
    policy = policy_for(tiny_wan(), max_sequence_length=16)
    alone = measured(policy)
    enable_context_parallel(policy, ulysses_degree=2)
    shared = measured(policy)
    if dist.get_rank() == 0:
        save_file(
            {**{f"alone.{k}": v for k, v in alone.items()}, **{f"shared.{k}": v for k, v in shared.items()}},
            sys.argv[1],
        )
    dist.barrier()
    end_processes(0)
