"""PyTorch's side of deft_bench_gpu's MLP step: the seeds' 512-2048-512-1 net,
ReLU, L2 loss, SGD lr 0.005, batch 1024, on cuda:0, eager. Prints
`step_ms X`, the median over repeats of 20 steps each, every repeat ending
with torch.cuda.synchronize()."""
import statistics
import time

import torch


def main():
    torch.manual_seed(7)
    dev = torch.device("cuda:0")
    net = torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.ReLU(),
        torch.nn.Linear(2048, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 1)).to(dev)
    for p in net.parameters():
        torch.nn.init.normal_(p, 0, 0.01)
    x = torch.randn(1024, 512, device=dev)
    y = torch.ones(1024, 1, device=dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.005)
    torch.backends.cuda.matmul.allow_tf32 = False  # deft's products are plain float32

    def steps(n):
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = 0.5 * ((net(x) - y) ** 2).mean()  # deft: per-sample losses, step() rescales by 1/batch
            loss.backward()
            opt.step()
        torch.cuda.synchronize()

    steps(5)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        steps(20)
        times.append((time.perf_counter() - t) / 20)
    print(f"step_ms {statistics.median(times) * 1e3:.4f}")


if __name__ == "__main__":
    main()
