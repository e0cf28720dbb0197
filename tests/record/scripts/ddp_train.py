# Data-parallel training with torch.distributed's gloo backend, launched one process per rank (RANK,
# WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment, as torchrun sets them). --bad-rank R: rank R's
# batch of step 1 holds an inf.
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--bad-rank", type=int, default=-1)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(100 + rank)
for step in range(3):
    x = torch.randn(4, 8, generator=g)
    y = torch.randint(0, 2, (4,), generator=g)
    if step == 1 and rank == args.bad_rank:
        x[2, 3] = float("inf")
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    print("rank %d step %d loss %.4f" % (rank, step, loss.item()))
dist.destroy_process_group()
