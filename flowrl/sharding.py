"""FSDP2's sharded tensors in checkpoints: gathered whole when written, cut back to each process's shard when read, so
a checkpoint holds the same full tensors whether the run was sharded, and loads into a run of any layout.

Under FSDP2 every parameter of the wrapped denoiser (and the optimizer's state of the trained ones) is a DTensor
holding this process's shard; gathering one is a collective, so every process calls `gathered` for the same tensors
in the same order. Tensors are gathered one at a time and moved to host memory, so a full fine-tune's checkpoint never
holds two whole copies on a GPU, and only the process that writes keeps them.
"""

from __future__ import annotations

import torch


def is_sharded(tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without distributed support, or before DTensor was public: nothing is sharded
        return False
    return isinstance(tensor, DTensor)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The full tensor of a shard (a collective), or the tensor itself."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor


def gathered(tensors: dict, keep: bool) -> dict:
    """`tensors` with every shard gathered whole (one at a time) into host memory, kept only where `keep`; whole
    tensors pass through as they are (detached, not copied: a checkpoint is written before training goes on, and
    the writer moves them to the host one at a time), as do values that are not tensors."""
    out = {}
    for name, value in tensors.items():
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if is_sharded(value):
                value = value.full_tensor()  # a collective: every process, in the same order
                value = value.cpu() if keep else None
        if keep:
            out[name] = value
    return out


def gathered_optimizer_state(state: dict, keep: bool) -> dict | None:
    """An optimizer's state_dict with every sharded state tensor (Adam's moments of a sharded parameter) whole, on the
    host; None where not `keep`."""
    per_param = {index: gathered(values, keep) for index, values in state["state"].items()}
    return {"state": per_param, "param_groups": state["param_groups"]} if keep else None


def like(value: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """`value` (a full tensor) as `reference` holds it: this process's shard of it when `reference` is sharded (no
    communication: every process read the same file), on its device."""
    if not is_sharded(reference):
        return value
    from torch.distributed.tensor import distribute_tensor

    value = value.to(reference.device_mesh.device_type)
    try:
        return distribute_tensor(value, reference.device_mesh, reference.placements, src_data_rank=None)
    except TypeError:  # a torch before src_data_rank: rank 0's value is scattered (every process calls this alike)
        return distribute_tensor(value, reference.device_mesh, reference.placements)


def sharded_optimizer_state(state: dict, params: list[torch.Tensor]) -> dict:
    """A checkpoint's optimizer state_dict (full tensors) cut to shards where its parameters (`params`, in the
    optimizer's order) are sharded: full-size state tensors become shards; scalars (Adam's step) stay as they are."""
    per_param = {}
    for index, values in state["state"].items():
        param = params[int(index)]
        per_param[index] = {
            key: like(value, param) if isinstance(value, torch.Tensor) and value.shape == param.shape else value
            for key, value in values.items()
        }
    return {"state": per_param, "param_groups": state["param_groups"]}


def reduced_over_processes(values: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """`values` reduced element-wise (`sum` or `max`) over every process of the process group (a collective: every
    process calls it at the same point); `values` itself without a group."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    reduced = values.clone()
    dist.all_reduce(reduced, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return reduced


def most_calls_of_any_process(count: int, device) -> int:
    """The largest `count` any process of the process group passes here (a collective: every process calls it at the
    same point; `count` itself without a group): how many forwards each runs so a sharded denoiser, which gathers its
    weights in every forward, meets the others in every one."""
    return int(reduced_over_processes(torch.tensor([count], device=device), "max").item())
