#!/usr/bin/env python3
"""Checks that deft's headers include one way: down the layers below, never
up, and that no two headers include each other (directly or in a cycle).

  scripts/check_layers.py [include/deft]

A statement flows down these layers and back: the user's expression (ops)
becomes nodes (expr), a task (eval/record.hpp) for the scheduler (engine),
which runs a device's kernels (eval/cpu, eval/gpu) on memory and streams
the device wing provides (device/: allocators, the backend interface,
device/cuda/: the CUDA runtime, lanes, staging, collectives). autograd/meta.hpp is
autograd's declared interface (the recording switch, the hooks the
operations call); autograd's nodes and backward() sit above the operations
they differentiate and are reached only through those hooks. A header may
include headers of its own layer or of lower ones. Exit status 1 lists
every offending include.
"""
import os
import re
import sys

# Lowest first. A path matches the first pattern that is a prefix of it
# (paths relative to include/deft).
LAYERS = [
    ("core", ["core/"]),
    ("device", ["device/"]),
    ("engine", ["engine/"]),
    ("autograd interface", ["autograd/meta.hpp"]),
    ("expr", ["expr/"]),
    ("eval", ["eval/"]),
    ("tensor", ["tensor.hpp"]),
    ("ops", ["ops/"]),
    ("io", ["io/"]),
    ("autograd", ["autograd/"]),
    ("deft.hpp", ["deft.hpp"]),
    ("dist", ["dist/"]),  # collectives across processes; only dist/mpi.hpp and dist/world.hpp include MPI
    ("nn", ["nn/", "nn.hpp"]),
    ("data", ["data/", "data.hpp"]),
    ("dist.hpp", ["dist.hpp"]),
    ("compiled runtime", ["src.hpp", "nn_src.hpp"]),  # the compiled mode's definitions of everything above
]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    for rank, (name, prefixes) in enumerate(LAYERS):
        if any(path == p or (p.endswith("/") and path.startswith(p)) for p in prefixes):
            return rank, name
    return None, None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "include", "deft")
    root = os.path.normpath(root)
    graph = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if not name.endswith(".hpp"):
                continue
            path = os.path.relpath(os.path.join(folder, name), root)
            deps = []
            with open(os.path.join(root, path)) as f:
                for line in f:
                    m = INCLUDE.match(line)
                    if m:
                        deps.append(os.path.normpath(os.path.join(os.path.dirname(path), m.group(1))))
            graph[path] = deps

    problems = []
    for path in sorted(graph):
        rank, name = layer_of(path)
        if rank is None:
            problems.append(f"{path}: in no layer (add it to LAYERS in {os.path.basename(__file__)})")
            continue
        for dep in graph[path]:
            if dep not in graph:
                problems.append(f"{path}: includes {dep}, which does not exist")
                continue
            dep_rank, dep_name = layer_of(dep)
            if dep_rank is not None and dep_rank > rank:
                problems.append(f"{path} ({name}) includes {dep} ({dep_name}), a higher layer")

    # Cycles: an include back to a header on the current path.
    state = {}
    stack = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in graph.get(node, []):
            if dep not in graph:
                continue
            if state.get(dep) == "open":
                cycle = stack[stack.index(dep):] + [dep]
                problems.append("include cycle: " + " -> ".join(cycle))
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)

    for p in problems:
        print(p)
    print(f"check_layers: {len(graph)} headers, {sum(map(len, graph.values()))} includes, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
