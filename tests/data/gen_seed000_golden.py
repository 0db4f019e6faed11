#!/opt/gradaccum/venv/bin/python
"""@generated golden values for tests/seed000_test.cpp — generated with Debian's
python3-torch (torch 1.13); rerun with the venv's: /opt/gradaccum/venv/bin/python tests/data/gen_seed000_golden.py

Seed 000's experiment in float64: the 16→32→GELU→1 MLP (and its BatchNorm1d
variant) on a batch of 8, MSE loss. Writes the weights, the batch, the full-batch
loss and gradients, and for the BatchNorm variant the gradient of the naive
4 × 2 accumulation (which differs from the full batch)."""
import json
import torch

torch.manual_seed(42)
torch.set_default_dtype(torch.float64)


def tensor_list(t):
    return t.detach().reshape(-1).tolist()


def make(batch_norm):
    middle = torch.nn.BatchNorm1d(32) if batch_norm else torch.nn.GELU()
    return torch.nn.Sequential(torch.nn.Linear(16, 32), middle, torch.nn.Linear(32, 1))


out = {}
x = torch.randn(8, 16)
y = torch.randn(8, 1)
out["x"] = tensor_list(x)
out["y"] = tensor_list(y)
for name, batch_norm in (("gelu", False), ("batchnorm", True)):
    net = make(batch_norm)
    net.train()
    params = {k: tensor_list(v) for k, v in net.named_parameters()}
    net.zero_grad()
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    record = {
        "params": params,
        "loss": loss.item(),
        "grads": {k: tensor_list(v.grad) for k, v in net.named_parameters()},
    }
    if batch_norm:
        net.zero_grad()
        for i in range(0, 8, 2):
            (torch.nn.functional.mse_loss(net(x[i:i + 2]), y[i:i + 2]) / 4).backward()
        record["grads_accumulated_4x2"] = {k: tensor_list(v.grad) for k, v in net.named_parameters()}
    out[name] = record

with open(__file__.replace("gen_seed000_golden.py", "seed000_golden.json"), "w") as f:
    json.dump(out, f, indent=1)
