"""The naive baseline: every admitted request reserves ``max_model_len`` token slots up front.

This is how a server without paging must work: it cannot know how long a response will be, so
it sets aside room for the longest possible sequence, as one contiguous region. The pool is cut
into ``num_blocks // blocks_per_seq`` regions; a request takes a whole region at admission and
gives it back when it ends. Same interface as :class:`KVCacheManager` (minus forking: a private region cannot be shared),
so the scheduler and the attention kernels work unchanged (a region is just a block table of consecutive ids), and
utilisation and batch size can be compared on equal memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from minivllm.math_utils import cdiv
from minivllm.request import Request


class ContiguousKVCacheManager:
    enable_caching = False

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.blocks_per_seq = cdiv(max_model_len, block_size)
        self.num_regions = num_blocks // self.blocks_per_seq
        if self.num_regions < 1:
            raise ValueError(
                f"contiguous KV cache needs {self.blocks_per_seq} blocks for one max_model_len="
                f"{max_model_len} sequence but the pool has only {num_blocks} blocks"
            )
        self._free_regions: deque[int] = deque(range(self.num_regions))
        self.req_to_region: dict[str, int] = {}
        self.req_to_block_ids: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_regions) * self.blocks_per_seq

    @property
    def num_used_blocks(self) -> int:
        return len(self.req_to_region) * self.blocks_per_seq

    @property
    def num_reserved_slots(self) -> int:
        return self.num_used_blocks * self.block_size

    def get_block_ids(self, request_id: str) -> list[int]:
        return self.req_to_block_ids.get(request_id, [])

    def get_computed_blocks(self, request: Request) -> tuple[list, int]:
        return [], 0  # no prefix caching without paging

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence = (),
        num_lookahead_tokens: int = 0,
    ) -> list | None:
        rid = request.request_id
        if request.num_computed_tokens + num_new_tokens > self.max_model_len:
            return None
        if rid in self.req_to_region:
            return self.req_to_block_ids[rid]
        if not self._free_regions:
            return None
        region = self._free_regions.popleft()
        self.req_to_region[rid] = region
        start = region * self.blocks_per_seq
        self.req_to_block_ids[rid] = list(range(start, start + self.blocks_per_seq))
        return self.req_to_block_ids[rid]

    def free(self, request: Request) -> None:
        region = self.req_to_region.pop(request.request_id, None)
        self.req_to_block_ids.pop(request.request_id, None)
        if region is not None:
            self._free_regions.append(region)

    def commit_written_blocks(self) -> None:
        pass  # no prefix cache

    def discard_unwritten_blocks(self) -> None:
        pass

    @property
    def num_referenced_blocks(self) -> int:
        return self.num_used_blocks

    def check_invariants(self, live_request_ids: Iterable[str] | None = None) -> None:
        regions = list(self.req_to_region.values())
        assert len(set(regions)) == len(regions), "a region is held by two requests"
        assert set(regions).isdisjoint(self._free_regions), "a held region is also free"
        assert len(regions) + len(self._free_regions) == self.num_regions, "a region was lost"
        if live_request_ids is not None:
            extra = set(self.req_to_region) - set(live_request_ids)
            assert not extra, f"regions held by requests that are not live: {sorted(extra)[:5]}"
