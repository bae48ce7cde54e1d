"""The channel between the judge and the candidate's process: length-prefixed messages on a
socket, each a JSON header followed by the raw bytes of the tensors it carries.

Nothing the candidate's side sends is executed or unpickled: a header is JSON, a tensor is
its dtype (from a fixed list), its shape and exactly that many bytes, rebuilt by the judge
with ``torch.frombuffer``. Sizes are bounded by the reader (``max_bytes``), so a hostile
peer can make a message fail, never make the judge run its code or exhaust its memory.

Child side: stdlib at module level; torch is imported where tensors are handled.
"""

from __future__ import annotations

import json
import math
import socket
import struct
from typing import Any

__all__ = ["Channel", "ChannelClosed", "ChannelError", "decode_value", "encode_value"]

_LENGTH = struct.Struct("!Q")
MAX_HEADER_BYTES = 4 * 1024 * 1024
# Value trees nest lists and tuples only this deep (KernelBench outputs are flat).
MAX_DEPTH = 8
# The dtypes a tensor may have on the wire, by name.
DTYPES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "complex128",
)


class ChannelError(Exception):
    """A message that breaks the protocol (too large, malformed, an unknown dtype)."""


class ChannelClosed(ChannelError):
    """The peer went away (it exited, crashed or was killed)."""


class Channel:
    """One end of the socket: ``send(header, blobs)`` and ``receive() -> (header, blobs)``."""

    def __init__(self, sock: socket.socket, max_bytes: int) -> None:
        self.sock = sock
        self.max_bytes = max_bytes  # the most a message's tensors may carry, in all

    def send(self, header: dict[str, Any], blobs: list[bytes | memoryview] | None = None) -> None:
        blobs = blobs or []
        body = json.dumps({**header, "blobs": [len(b) for b in blobs]}, allow_nan=True).encode()
        self.sock.sendall(_LENGTH.pack(len(body)) + body)
        for blob in blobs:
            self.sock.sendall(blob)

    def receive(self) -> tuple[dict[str, Any], list[bytearray]]:
        size = _LENGTH.unpack(self._exactly(_LENGTH.size))[0]
        if size > MAX_HEADER_BYTES:
            raise ChannelError(f"a message header of {size} bytes (limit {MAX_HEADER_BYTES})")
        try:
            header = json.loads(self._exactly(size))
        except ValueError as exc:
            raise ChannelError(f"a message header that is not JSON ({exc})") from None
        sizes = header.pop("blobs", []) if isinstance(header, dict) else None
        if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes):
            raise ChannelError("a message whose tensor sizes are not a list of counts")
        if sum(sizes) > self.max_bytes:
            raise ChannelError(
                f"a message carrying {sum(sizes)} bytes of tensors (limit {self.max_bytes})"
            )
        return header, [self._exactly(n) for n in sizes]

    def _exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            read = self.sock.recv_into(view[got:], n - got)
            if read == 0:
                raise ChannelClosed("the other process closed the channel")
            got += read
        return buf


def encode_value(value: Any, blobs: list[bytes | memoryview], depth: int = 0) -> Any:
    """``value`` (tensors, lists/tuples of values, numbers, strings, None) as JSON, its
    tensors' bytes appended to ``blobs`` (copied to the CPU, contiguous)."""
    import torch

    if depth > MAX_DEPTH:
        raise ChannelError(f"values nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ChannelError(f"a tensor of dtype {dtype}, which the channel does not carry")
        data = value.detach().to("cpu").contiguous()
        blobs.append(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
        return {
            "t": "tensor",
            "dtype": dtype,
            "shape": list(data.shape),
            "blob": len(blobs) - 1,
            "device": value.device.type,
            "class": f"{type(value).__module__}.{type(value).__qualname__}",
        }
    if isinstance(value, list | tuple):
        items = [encode_value(v, blobs, depth + 1) for v in value]
        return {"t": type(value).__name__, "items": items}
    if value is None or isinstance(value, bool | int | str):
        return {"t": "scalar", "v": value}
    if isinstance(value, float):
        # JSON has no NaN/Infinity: carried as text.
        return {"t": "float", "v": value if math.isfinite(value) else repr(value)}
    raise ChannelError(f"a value of type {type(value).__name__}, which the channel does not carry")


def decode_value(obj: Any, blobs: list[bytearray], device: str, depth: int = 0) -> Any:
    """The value :func:`encode_value` encoded, tensors rebuilt (on ``device``) from their
    bytes; anything malformed raises ``ChannelError``."""
    import torch

    if depth > MAX_DEPTH or not isinstance(obj, dict):
        raise ChannelError("a malformed value")
    kind = obj.get("t")
    if kind == "tensor":
        dtype, shape, index = obj.get("dtype"), obj.get("shape"), obj.get("blob")
        if dtype not in DTYPES or not isinstance(index, int) or not 0 <= index < len(blobs):
            raise ChannelError("a malformed tensor")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ChannelError("a tensor with a malformed shape")
        torch_dtype = getattr(torch, dtype)
        data = blobs[index]
        expected = math.prod(shape) * torch.empty((), dtype=torch_dtype).element_size()
        if len(data) != expected:
            raise ChannelError(
                f"a tensor of shape {shape} and {dtype} carried in {len(data)} bytes"
            )
        flat = (
            torch.frombuffer(data, dtype=torch_dtype) if data else torch.empty(0, dtype=torch_dtype)
        )
        return flat.reshape(shape).to(device)
    if kind in ("list", "tuple"):
        items = obj.get("items")
        if not isinstance(items, list):
            raise ChannelError("a malformed sequence")
        decoded = [decode_value(v, blobs, device, depth + 1) for v in items]
        return decoded if kind == "list" else tuple(decoded)
    if kind == "scalar" and (obj.get("v") is None or isinstance(obj.get("v"), bool | int | str)):
        return obj.get("v")
    if kind == "float" and isinstance(obj.get("v"), float | int | str):
        try:
            return float(obj["v"])
        except ValueError:
            raise ChannelError("a malformed float") from None
    raise ChannelError("a malformed value")


def tensor_facts(obj: Any, path: str = "output") -> list[tuple[str, dict[str, Any]]]:
    """Each tensor leaf of an encoded value with what its sender said of it (its class and
    device), by path: the judge's view of what the candidate returned."""
    if not isinstance(obj, dict):
        return []
    if obj.get("t") == "tensor":
        return [(path, obj)]
    facts: list[tuple[str, dict[str, Any]]] = []
    for i, item in enumerate(obj.get("items") or []):
        facts.extend(tensor_facts(item, f"{path}[{i}]"))
    return facts
