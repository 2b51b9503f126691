"""PyTorch's side of the ResNet-18 comparison: the D2L chapter's ResNet-18
(nn::resnet18: 3x3 stem without max pooling, four stages of two residual
blocks, global average pooling) on Fashion-MNIST, fp32 eager, SGD lr 0.1
momentum 0.9, batch 256, as `train_fashion_mnist --model resnet18` runs it.

    python3 gpu_torch_resnet.py DATA_DIR [--epochs N] [--width W]

Prints one line per epoch (`epoch E seconds S test_acc A`), each epoch's
time ending with torch.cuda.synchronize(). TF32 is off for products and
convolutions: deft computes in plain float32."""
import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch
from torch import nn


def idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(directory, prefix):
    def find(stem):
        for name in (stem, stem + ".gz"):
            if os.path.exists(os.path.join(directory, name)):
                return os.path.join(directory, name)
        raise FileNotFoundError(os.path.join(directory, stem))
    x = idx(find(f"{prefix}-images-idx3-ubyte")).astype(np.float32) / 255.0
    y = idx(find(f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)


class Residual(nn.Module):
    def __init__(self, cin, c, use_1x1conv=False, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, c, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c, momentum=0.1)  # PyTorch's 0.1 is Gluon's and deft's 0.9
        self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c, momentum=0.1)
        self.shortcut = nn.Conv2d(cin, c, 1, stride) if use_1x1conv else None

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


def resnet18(classes, width):
    layers = [nn.Conv2d(1, width, 3, 1, 1), nn.BatchNorm2d(width), nn.ReLU()]
    cin = width
    for stage in range(4):
        c = width << stage
        layers.append(Residual(cin, c, stage > 0, 2 if stage > 0 else 1))
        layers.append(Residual(c, c))
        cin = c
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(42)
    dev = torch.device("cuda:0")
    xtr, ytr = load(args.data, "train")
    xte, yte = load(args.data, "t10k")
    xtr, ytr, xte, yte = xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev)
    net = resnet18(10, args.width).to(dev)
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")  # deft: summed per-sample losses, step() rescales
    batch = 256
    for epoch in range(1, args.epochs + 1):
        net.train()
        torch.cuda.synchronize()
        start = time.perf_counter()
        order = torch.randperm(xtr.shape[0], device=dev)
        for i in range(0, xtr.shape[0], batch):
            rows = order[i:i + batch]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(xtr[rows]), ytr[rows]) / rows.numel()
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        net.eval()
        with torch.no_grad():
            correct = sum((net(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
                          for i in range(0, xte.shape[0], 1000))
        print(f"epoch {epoch} seconds {seconds:.2f} test_acc {correct / xte.shape[0]:.4f}", flush=True)


if __name__ == "__main__":
    main()
