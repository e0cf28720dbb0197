# flight_train.py's MLP and data (step --bad-step's batch holds an inf; the script drops that step's gradients
# and goes on), recorded by a plain `python3 api_flight.py OUT N` run itself through the Python API, with the
# flight recorder: ampscope.torch.record(OUT, sample_every=4, flight_recorder=N). N 0: no flight recorder.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import ampscope.torch as at

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("flight", type=int)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--bad-step", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(4321)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(args.steps, 16, 32)
data[args.bad_step, 5, 7] = float("inf")
labels = torch.randint(0, 10, (args.steps, 16))
with at.record(args.out, sample_every=4, flight_recorder=args.flight, optimizers=[opt]):
    for i in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(data[i]), labels[i])
        loss.backward()
        if not math.isfinite(loss.item()):
            opt.zero_grad(set_to_none=True)  # skip the bad batch
        opt.step()
        print(f"step {i} loss {loss.item():.4f}")
