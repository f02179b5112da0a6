"""Two gloo processes, one DDP-wrapped module holding a buffer: rank 0 runs two forwards with grad per step (the
first with the weight unused, as a gated LoRA's adapter-free pass), rank 1 one; each then a backward. With
`flowrl.builders.without_buffer_broadcast` the steps finish and the gradients agree; with DDP's default, rank 0's
extra buffer broadcast pairs with rank 1's gradient all-reduce."""

import datetime

import torch
import torch.distributed as dist

from flowrl.builders import without_buffer_broadcast
from flowrl.devices import end_processes


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("table", torch.arange(4.0))
        self.use_weight = True

    def forward(self, x):
        return self.linear(x + self.table) if self.use_weight else x * self.table


if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))  # slow starts under a busy suite
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = Net()
    model = torch.nn.parallel.DistributedDataParallel(net)
    without_buffer_broadcast(model)
    x = torch.ones(2, 4, requires_grad=True)
    for step in range(3):
        model.zero_grad()
        out = model(x).sum()
        if rank == 0:
            net.use_weight = False
            out = out + model(x).sum()  # the extra forward only this process runs
            net.use_weight = True
        out.backward()
        grads = torch.cat([p.grad.flatten() for p in net.parameters()])
        gathered = [torch.zeros_like(grads) for _ in range(2)]
        dist.all_gather(gathered, grads)
        assert torch.equal(gathered[0], gathered[1]), step
    dist.barrier()  # no process exits while another may still be sending to it
    print("ok", rank, flush=True)
    end_processes(0)
