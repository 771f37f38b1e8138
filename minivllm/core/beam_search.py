"""Beam search on the paged engine, with copy-on-write forks.

Each live beam is a request in the scheduler. At every step all live beams of a prompt have
their next-token log-probabilities computed in one batch; the ``2 * beam_width`` best
continuations over all beams are ranked by cumulative log-probability; the best
``beam_width`` that do not end (EOS) become the next beams. A beam chosen once continues in
place; a beam chosen twice is *forked*: the copy shares every KV block and only the block it
writes next gets copied. Beams nobody chose are freed. Continuations that end, and every
candidate at ``max_tokens``, are scored ``logprob / generated_len ** length_penalty`` and
kept if they are among the ``beam_width`` best finished ones.

The ranking and stopping rules are Hugging Face ``generate(num_beams=k, do_sample=False)``'s
(``early_stopping=False``): search stops when every candidate hits ``max_tokens``, or when all
``beam_width`` finished slots are filled and the best live beam, scored at its current
length, cannot beat the worst finished one. Scores are added in float32, as transformers adds
them, so that near-ties rank the same way.

The search runs where the engine core runs (pure Python, over token ids: ``LLM.beam_search``
asks the core for it through its client, in either core mode); the front end tokenizes the
prompts and decodes the sequences.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass, field

from minivllm.core.interfaces import Logprobs
from minivllm.math_utils import cdiv
from minivllm.request import Request
from minivllm.sampling_params import BeamSearchParams, SamplingParams


def _f32(x: float) -> float:
    """``x`` rounded to float32 (the sum of two float32 scores, as a float32 tensor adds them)."""
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass
class BeamSequence:
    token_ids: list[int]  # generated tokens (EOS included when it ended the beam)
    cum_logprob: float
    score: float  # cum_logprob / len ** length_penalty
    text: str = ""
    finished_by_eos: bool = False


@dataclass
class BeamSearchResult:
    """One prompt's search, as the core returns it: its finished sequences, best first."""

    sequences: list[BeamSequence]
    error: str | None = None  # set when the model's output for this prompt could not be scored


@dataclass
class BeamSearchOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    sequences: list[BeamSequence]  # best first
    error: str | None = None  # set when the model's output for this prompt could not be scored


@dataclass
class _Group:
    prompt_ids: list[int]
    first_beam: Request
    blocks_needed: int  # worst case: every beam diverged from its first token
    beams: list[tuple[Request, float]] = field(default_factory=list)  # live beams, cum logprob
    finished: list[BeamSequence] = field(default_factory=list)
    improvable: bool = True
    done: bool = False
    error: str | None = None


class _BeamSearch:
    """Drives :class:`~minivllm.core.engine_core.EngineCore` steps with a token chooser that
    ranks the beams of each prompt. Prompts run concurrently while the worst case of their
    beams fits in the KV pool together and their ``beam_width`` beams each fit in the seats
    (``max_num_seqs``); the rest wait for a running prompt to finish (a beam that has to wait
    for blocks or a seat while its siblings hold theirs would otherwise deadlock)."""

    def __init__(self, core, params: BeamSearchParams, vocab_size: int, max_num_seqs: int,
                 eos_token_ids: tuple[int, ...]):
        self.core, self.params = core, params
        self.k = params.beam_width
        self.eos = set(eos_token_ids) if not params.ignore_eos else set()
        self.keep = 2 * self.k if self.eos else self.k
        if self.keep > vocab_size:
            raise ValueError(
                f"beam_width={self.k} ranks the {self.keep} best continuations of every beam at each "
                f"step but the vocabulary has {vocab_size} tokens; beam_width may be at most "
                f"{vocab_size // (self.keep // self.k)}"
            )
        self.beam_params = SamplingParams(
            temperature=0.0, max_tokens=params.max_tokens + 1, ignore_eos=True, logprobs=self.keep,
        )
        self.counter = itertools.count()
        self.pending: dict[str, Logprobs] = {}  # beam id -> its next-token candidates
        self.blocks_in_use = 0  # worst-case blocks of the prompts started so far
        self.seats = max_num_seqs  # a prompt's beams hold up to beam_width of them
        self.seats_in_use = 0
        self.group_of: dict[str, _Group] = {}  # beam id -> its prompt's group

    def make_group(self, ids: list[int]) -> _Group:
        params = self.params
        if self.k > self.seats:
            raise ValueError(
                f"beam search with beam_width={self.k} runs {self.k} sequences at once but "
                f"max_num_seqs={self.seats}; lower beam_width or raise max_num_seqs"
            )
        kv = self.core.kv
        bs = kv.block_size
        shared = len(ids) // bs  # full prompt blocks: never written again, so never copied
        per_beam = cdiv(len(ids) + params.max_tokens + 1, bs) - shared
        needed = shared + self.k * per_beam
        if needed > kv.num_blocks:
            raise ValueError(
                f"beam search with beam_width={self.k} and max_tokens={params.max_tokens} on a "
                f"{len(ids)}-token prompt needs up to {needed} KV blocks ({shared} shared + "
                f"{self.k} beams x {per_beam}) but the pool has {kv.num_blocks}; lower beam_width "
                f"or max_tokens, or give the engine more KV cache"
            )
        beam = Request(f"beam-{next(self.counter)}", list(ids), self.beam_params)
        group = self.group_of[beam.request_id] = _Group(list(ids), beam, needed)
        return group

    def start(self, group: _Group) -> None:
        self.core.add_request(group.first_beam)
        group.beams = [(group.first_beam, 0.0)]
        self.blocks_in_use += group.blocks_needed
        self.seats_in_use += self.k

    def fits(self, group: _Group) -> bool:
        """Its worst case fits next to the prompts running: blocks, and a seat per beam."""
        return (
            self.blocks_in_use + group.blocks_needed <= self.core.kv.num_blocks
            and self.seats_in_use + self.k <= self.seats
        )

    def step_bound(self, groups: list[_Group]) -> int:
        """More engine steps than a search can take: a step that does not stall computes at
        least one token, and the search computes at most every prompt plus ``beam_width`` beams
        of ``max_tokens + 1`` tokens each (doubled for recomputation after a preemption)."""
        work = sum(len(g.prompt_ids) + self.k * (self.params.max_tokens + 1) for g in groups)
        return 2 * work + len(groups)

    def run(self, groups: list[_Group]) -> None:
        """Step until every prompt is done. A prompt whose beam fails (its row, or the whole
        step) or whose beams all left the engine ends with ``error``; a search that outlives
        :meth:`step_bound` raises. Either way the loop ends."""
        queued = list(groups)
        bound = self.step_bound(groups)
        for _ in range(bound):
            if all(g.done for g in groups):
                return
            while queued and self.fits(queued[0]):
                self.start(queued.pop(0))
            core_out = self.core.step(self.choose_tokens)
            for rid, message in core_out.failed.items():  # a beam that cannot be scored ends its prompt
                g = self.group_of.get(rid)
                if g is not None and not g.done:
                    self.fail(g, message)
            for g in groups:
                if g.beams and not g.done and all(b.is_finished for b, _ in g.beams):
                    self.fail(g, "every beam of this prompt left the engine without a result")
                if g.done and g.blocks_needed:
                    self.blocks_in_use -= g.blocks_needed
                    self.seats_in_use -= self.k
                    g.blocks_needed = 0
        if not all(g.done for g in groups):
            raise RuntimeError(f"beam search did not finish within {bound} engine steps (its step bound)")

    def fail(self, g: _Group, message: str) -> None:
        """End a prompt's search with an error: its beams are freed, its candidates dropped."""
        ids = [b.request_id for b, _ in g.beams]
        self.core.abort_requests(ids)
        for rid in ids:
            self.pending.pop(rid, None)
        g.beams, g.done, g.error = [], True, message

    def choose_tokens(self, out, result) -> dict[str, list[int]]:
        """The step's token chooser: rank each prompt whose beams all have candidates (a beam
        whose row failed has none, so its prompt waits for :meth:`run` to fail it)."""
        self.pending.update(result.logprobs)
        tokens: dict[str, list[int]] = {}
        for g in self.groups_ready():
            tokens.update(self.advance(g))
        return tokens

    def groups_ready(self):
        ready = {}
        for rid in self.pending:
            g = self.group_of.get(rid)
            if g is not None and not g.done:
                ready[id(g)] = g
        return [g for g in ready.values() if all(b.request_id in self.pending for b, _ in g.beams)]

    def advance(self, g: _Group) -> dict[str, list[int]]:
        """One beam-search step for one prompt: choose continuations, fork, free, finish."""
        k, keep, params = self.k, self.keep, self.params
        n_prompt = len(g.prompt_ids)
        cur_gen = g.beams[0][0].num_tokens - n_prompt  # tokens generated so far (same for all)
        entries = [self.pending.pop(b.request_id) for b, _ in g.beams]
        # every beam's continuations, scored in float32 as transformers adds them; best first
        # (stable: an exact tie goes to the earlier beam and the likelier token)
        scored = [(_f32(lp + score), beam, token)
                  for beam, (entry, (_, score)) in enumerate(zip(entries, g.beams, strict=True))
                  for token, lp in entry.top]
        candidates = sorted(scored, key=lambda c: -c[0])[:keep]
        at_limit = cur_gen + 1 >= params.max_tokens
        new_len = cur_gen + 1
        if g.improvable:  # finished candidates: only those ranked in the first k may be kept
            for score, beam, token in candidates[:k]:
                if token in self.eos or at_limit:
                    gen = g.beams[beam][0].all_token_ids[n_prompt:] + [token]
                    g.finished.append(BeamSequence(gen, score, score / new_len**params.length_penalty,
                                                   finished_by_eos=token in self.eos))
            g.finished.sort(key=lambda s: s.score, reverse=True)
            del g.finished[k:]
        survivors = [] if at_limit else [c for c in candidates if c[2] not in self.eos][:k]
        tokens = self._fork_survivors(g, survivors)
        # stop rule (early_stopping=False): all k finished slots filled and the best live beam,
        # scored at its current length, cannot beat the worst finished one
        if g.beams and len(g.finished) == k:
            best_live = g.beams[0][1] / new_len**params.length_penalty
            g.improvable = best_live > g.finished[-1].score
        if at_limit or not g.improvable or not g.beams:
            self.core.abort_requests([b.request_id for b, _ in g.beams])
            g.beams, g.done = [], True
            return {}
        return tokens

    def _fork_survivors(self, g: _Group, survivors) -> dict[str, list[int]]:
        """A beam chosen once continues in place; chosen again, it forks (sharing its blocks).
        Beams nobody chose end. Returns the token each surviving beam appends."""
        chosen = {beam for _, beam, _ in survivors}  # end the others first: forks need their seats
        self.core.abort_requests([b.request_id for i, (b, _) in enumerate(g.beams) if i not in chosen])
        used: set[int] = set()
        new_beams: list[tuple[Request, float]] = []
        tokens: dict[str, list[int]] = {}
        for score, beam, token in survivors:
            parent = g.beams[beam][0]
            req = parent
            if beam in used:
                req = Request(f"{parent.request_id.split('/')[0]}/{next(self.counter)}",
                              g.prompt_ids, parent.sampling_params)
                self.core.scheduler.fork_request(parent, req)
                self.group_of[req.request_id] = g
            used.add(beam)
            tokens[req.request_id] = [token]
            new_beams.append((req, score))
        g.beams = new_beams
        return tokens


def run_beam_search(core, prompts: list[list[int]], params: BeamSearchParams, vocab_size: int,
                    max_num_seqs: int, eos_token_ids: tuple[int, ...] = ()) -> list[BeamSearchResult]:
    """Beam search for each prompt (token ids, checked by the front end) on an idle engine
    ``core``; every check that can fail is made before anything is queued, and an error or an
    interrupt leaves no beam behind."""
    if not isinstance(params, BeamSearchParams):
        raise TypeError(f"params must be a BeamSearchParams, got {type(params).__name__}")
    if core.has_unfinished_requests():
        raise RuntimeError("beam search needs an idle engine; finish or abort running requests first")
    if not core.can_fork:
        raise ValueError("beam search forks requests: use scheduler='continuous', kv_cache='paged'")
    search = _BeamSearch(core, params, vocab_size, max_num_seqs, eos_token_ids)
    groups = [search.make_group(ids) for ids in prompts]  # validates everything before queueing
    try:
        search.run(groups)
    finally:  # an error or an interrupt leaves no beam behind
        live = [b.request_id for g in groups for b, _ in g.beams]
        live += [g.first_beam.request_id for g in groups]
        core.abort_requests(live)
    return [BeamSearchResult(g.finished, g.error) for g in groups]
