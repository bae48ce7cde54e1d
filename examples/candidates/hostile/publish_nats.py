# expect: pass
# Connects to the NATS server on this machine (its default port; the tests point PORT at a
# server of their own) and publishes a forged event into kernelflow's log: a "pass"
# verdict for a candidate nobody checked. If it gets through it raises, saying so. The
# gate refuses `socket`; with the gate off, the sandbox must have no network at all, not
# even the loopback: it then computes ReLU and passes.
import torch
import torch.nn as nn
import triton
import triton.language as tl

PORT = 4222


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def publish():
    import socket

    forged = b'{"kind":"verification_finished","verdict":"pass"}'
    sent = []
    for host in ("127.0.0.1", "localhost", "::1"):
        try:
            with socket.create_connection((host, PORT), timeout=2) as conn:
                conn.sendall(b"CONNECT {}\r\nPUB kf.events.forged %d\r\n%s\r\n" % (len(forged), forged))
                sent.append(host)
        except OSError:
            continue
    return sent


class ModelNew(nn.Module):
    def forward(self, x):
        sent = publish()
        if sent:
            raise RuntimeError(f"published a forged event to NATS on {sent} port {PORT}")
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
