"""Moving a step's small host-side arrays onto the device in one copy that does not block.

Every step starts from plain Python lists (token ids, positions, slots, block tables, the
sampling settings of each row). ``torch.tensor(values, device="cuda")`` makes one blocking copy
per list: the host waits for the device to finish everything queued before it, once per list.
:func:`to_device` packs the lists of one dtype family into one host tensor (page-locked when
the device is a GPU, so that the copy can run asynchronously), copies it with
``non_blocking=True`` and hands back views of the device copy, each cast to its own dtype on
the device. The host goes on preparing while the copy runs; the kernels that read the tensors
are queued after it on the same stream, so they see the data. On a CPU it is one tensor and
free views.

``minivllm/engine/host_syncs.py`` counts what is left.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Where a tensor meant to stay on the host is made: ``torch.tensor(values, device=HOST)``. Said
# out loud, so that it stays there whatever the default device is (a run under
# ``torch.set_default_device("meta")`` finds every tensor made without a device), and so that
# ``HostSyncCounter`` knows it from a tensor on the compute device, even when both are the CPU.
HOST = torch.device("cpu")


def to_device(arrays: Sequence[tuple[Sequence, torch.dtype]], device: torch.device | str) -> list[torch.Tensor]:
    """``[(values, dtype), ...]`` -> one 1-D tensor per entry on ``device``, in order. Integer
    and bool entries travel in one int64 copy, floating ones in one float32 copy (float64 if an
    entry asks for it), so every value arrives exact; each entry is then cast to its dtype."""
    device = torch.device(device)
    out: list[torch.Tensor | None] = [None] * len(arrays)
    for floating in (False, True):
        picked = [i for i, (_, dtype) in enumerate(arrays) if (dtype in _FLOATS) == floating]
        if not picked:
            continue
        flat: list = []
        sizes = []
        for i in picked:
            values = arrays[i][0]
            flat.extend(values)
            sizes.append(len(values))
        wide = torch.float64 if any(arrays[i][1] == torch.float64 for i in picked) else torch.float32
        host = torch.tensor(flat, dtype=wide if floating else torch.int64, device=HOST,
                            pin_memory=device.type == "cuda")
        moved = host.to(device, non_blocking=True)  # on a CPU: the same tensor, no copy
        for i, part in zip(picked, moved.split(sizes), strict=True):
            dtype = arrays[i][1]
            out[i] = part if part.dtype == dtype else part.to(dtype)
    return out  # type: ignore[return-value]


def flatten_table(rows: Sequence[Sequence[int]], width: int, fill: int = 0) -> list[int]:
    """A ragged table as one flat list of ``len(rows) * width`` values, each row padded with
    ``fill``: an entry for :func:`to_device` (``.view(len(rows), width)`` what it gives back)."""
    flat: list[int] = []
    for row in rows:
        flat.extend(row)
        flat.extend([fill] * (width - len(row)))
    return flat


def select_rows(tensor: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """``tensor[rows]`` for host-side row numbers: a view when they are consecutive (a decode
    step's rows usually are), else a gather whose index reaches the device without blocking."""
    if rows and all(b == a + 1 for a, b in zip(rows, rows[1:])):
        return tensor[rows[0] : rows[-1] + 1]
    (index,) = to_device([(rows, torch.long)], tensor.device)
    return tensor.index_select(0, index)
