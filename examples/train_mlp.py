"""Train an MLP with a whole training step as one CUDA graph: forward, backward and the optimizer's update.

    python -m rxcuda.examples.train_mlp [steps]

A synthetic task: points in 16 dimensions, labelled by which of 4 random directions they lie closest to. A
16-64-4 MLP learns it with softmax cross-entropy. `rt.function` traces the step once (the forward pass,
`rt.grad` for the backward pass, `opt.step` writing the weights and the optimizer's state in place) and
replays it as one CUDA graph per call; each batch is written into the same input tensors, so every step is one
graph launch. The loss is printed as it goes down, then the accuracy on fresh points, and the step's cost.
Without a GPU the tensors are NumPy arrays and the same step runs on the tensor functions' CPU backend (traced
once, replayed on the host; no CUDA graph).
"""

import sys
import time

import numpy as np

import rxcuda
import rxcuda.tensor as rt

ok, why = rxcuda.probe()
if ok:
    import cupy as xp  # the tensors live on the GPU: the step runs as one CUDA graph
else:  # the tensor functions' CPU backend (NumPy): the same program, traced once and replayed on the host
    print(f"no CUDA device ({why}): running on the CPU device (the tensor functions' NumPy backend)")
    xp = np

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
rng = np.random.default_rng()
D, H, K, BATCH = 16, 64, 4, 256
directions = rng.standard_normal((K, D)).astype(np.float32)


def batch(n: int):
    x = rng.standard_normal((n, D)).astype(np.float32)
    labels = (x @ directions.T).argmax(axis=1)
    return x, np.eye(K, dtype=np.float32)[labels], labels


params = [rt.tensor(xp.asarray(p, dtype=np.float32), requires_grad=True) for p in (  # float32 throughout: a graph's
    rng.standard_normal((D, H)) / np.sqrt(D), np.zeros(H),                             # matmul takes one type
    rng.standard_normal((H, K)) / np.sqrt(H), np.zeros(K))]
opt = rt.Adam(params, lr=0.01)


def logits(x):
    w1, b1, w2, b2 = params
    return rt.maximum(x @ w1 + b1, 0.0) @ w2 + b2


@rt.function
def train_step(x, y):
    z = logits(x)
    loss = (rt.logsumexp(z, axis=1) - (z * y).sum(axis=1)).mean()  # softmax cross-entropy
    opt.step(rt.grad(loss, params))
    return loss


predict = rt.function(lambda x: rt.argmax(logits(x), axis=1))

x0, y0, _ = batch(BATCH)
x, y = rt.tensor(xp.asarray(x0)), rt.tensor(xp.asarray(y0))  # the graph's bound inputs: batches are written in
first = last = None
t0 = time.perf_counter()
for step in range(1, steps + 1):
    xb, yb, _ = batch(BATCH)
    x[...], y[...] = xp.asarray(xb), xp.asarray(yb)
    loss = train_step(x, y)
    if step == 1 or step % max(steps // 10, 1) == 0 or step == steps:
        value = float(loss)
        first = value if first is None else first
        last = value
        print(f"step {step:4d}: loss {value:.4f}")
if ok:
    xp.cuda.Device().synchronize()
took = (time.perf_counter() - t0) / steps * 1e6

xt, _, labels = batch(4096)
accuracy = float((predict(rt.tensor(xp.asarray(xt))).numpy() == labels).mean())
s = train_step.stats
print(f"{steps} steps, {took:.0f} us a step (data upload included); traced {s.traces}x, {s.captures} CUDA graph, "
      f"{s.graph_launches} graph launches")
print(f"loss {first:.4f} -> {last:.4f}; accuracy on 4096 fresh points {accuracy:.1%}")
if not last < first:
    sys.exit("the loss did not go down")
print("OK: the loss went down")
