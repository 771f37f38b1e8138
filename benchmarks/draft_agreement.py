"""How often the draft model's greedy next token is the target model's greedy next token.

Speculative decoding with greedy verification keeps a draft token exactly when it equals the
target's own greedy choice at that position, so this agreement predicts the acceptance rate.
Both models run in Hugging Face transformers, float32, over whole sequences at once (teacher
forcing), and the argmax of their logits is compared at every position.

Two kinds of sequence:

- ``held-out``: stories from the tiny model's held-out split (the documents
  ``scripts/train_tiny_model.py`` evaluates on, none of them in the training set), written as
  ``<s> text </s>``. Where the story's next token differs from the models' guesses, the next
  context is still the story's, as in teacher-forced evaluation.
- ``target-greedy``: the first words of each of those stories, continued by the target's own
  greedy decoding up to ``</s>``. This is the text speculative decoding actually verifies, so
  here a run of agreeing positions is exactly what greedy verification accepts: with ``k``
  draft tokens per step, ``min(run, k)`` of them are kept and the target adds one of its own
  (only the generated tokens are compared, not the prompt).

    python benchmarks/draft_agreement.py [--stories 50] [--k 4] [--prompt-words 4]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import train_tiny_model  # noqa: E402

import minivllm  # noqa: E402


def heldout_stories(n: int, seed: int = 0, train_docs: int = 70000,
                    heldout_docs: int = 1500) -> list[str]:
    """The first ``n`` held-out documents of the tiny model's training run (its defaults)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    _, held = train_tiny_model.corpus_split(train_docs, heldout_docs, seed)
    if n > len(held):
        raise ValueError(f"n = {n} exceeds the {len(held)} held-out documents")
    return held[:n]


def load(model_dir: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True,
                                                 dtype=torch.float32)
    return tok, model.eval()


@dataclass
class Agreement:
    """``match[s][j]`` is True when both models' greedy token after position ``start[s] + j``
    of sequence ``s`` is the same; ``nll`` sums, per model, the negative log-likelihood of
    the sequences' actual tokens at those positions."""

    match: list[list[bool]]
    nll: dict[str, float]

    @property
    def positions(self) -> int:
        return sum(len(m) for m in self.match)

    @property
    def rate(self) -> float:
        return sum(map(sum, self.match)) / self.positions

    def tokens_per_step(self, k: int) -> float:
        """Tokens per target forward pass when each step drafts ``k`` tokens and greedy
        verification keeps the agreeing prefix, then adds the target's own next token.

        Steps are simulated along each sequence: a step at position ``p`` keeps
        ``a = min(run, k)`` draft tokens (``run`` = agreeing positions from ``p`` on) and
        moves to ``p + a + 1``; a step that reaches the end of the sequence adds nothing."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        steps = 0
        for m in self.match:
            pos = 0
            while pos < len(m):
                run = 0
                while run < k and pos + run < len(m) and m[pos + run]:
                    run += 1
                pos += run + 1
                steps += 1
        return self.positions / steps

    def loss(self, name: str) -> float:
        """Mean negative log-likelihood per predicted token (nats)."""
        return self.nll[name] / self.positions


@torch.no_grad()
def greedy_agreement(target, draft, sequences: list[list[int]],
                     starts: list[int] | None = None) -> Agreement:
    """Teacher-force both models over each token sequence and compare their argmax tokens.

    Position ``i`` predicts token ``i + 1``; positions before ``starts[s]`` (default 0) are
    context only, so a sequence of ``L`` tokens gives ``L - 1 - starts[s]`` comparisons.
    ``target`` and ``draft`` are causal LMs that take ``input_ids``."""
    if not sequences:
        raise ValueError("sequences is empty")
    starts = [0] * len(sequences) if starts is None else starts
    if len(starts) != len(sequences):
        raise ValueError(f"{len(starts)} starts for {len(sequences)} sequences")
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(f"vocab sizes differ: target {target.config.vocab_size}, "
                         f"draft {draft.config.vocab_size}")
    t_dev, d_dev = next(target.parameters()).device, next(draft.parameters()).device
    match, nll = [], {"target": 0.0, "draft": 0.0}
    for seq, start in zip(sequences, starts):
        if not 0 <= start <= len(seq) - 2:
            raise ValueError(f"start {start} must be in [0, {len(seq) - 2}] for a sequence "
                             f"of {len(seq)} tokens")
        ids = torch.tensor([seq], dtype=torch.long, device=t_dev)
        logits = {"target": target(input_ids=ids).logits[0, start:-1].float(),
                  "draft": draft(input_ids=ids.to(d_dev)).logits[0, start:-1].float().to(t_dev)}
        nxt = ids[0, start + 1:]
        for name, lg in logits.items():
            nll[name] += torch.nn.functional.cross_entropy(lg, nxt, reduction="sum").item()
        match.append((logits["target"].argmax(-1) == logits["draft"].argmax(-1)).tolist())
    return Agreement(match, nll)


def story_tokens(tok, story: str) -> list[int]:
    """``<s> text </s>``, as the models were trained."""
    return tok(story)["input_ids"] + [tok.eos_token_id]


@torch.no_grad()
def target_greedy(tok, target, stories: list[str], prompt_words: int,
                  max_new_tokens: int = 256) -> tuple[list[list[int]], list[int]]:
    """Each story's first ``prompt_words`` words, then the target's greedy continuation (up
    to and including ``</s>``); also the position that predicts each first generated token."""
    if prompt_words < 1:
        raise ValueError(f"prompt_words must be at least 1, got {prompt_words}")
    device = next(target.parameters()).device
    seqs, starts = [], []
    for story in stories:
        prompt = " ".join(story.split(" ")[:prompt_words])
        enc = tok(prompt, return_tensors="pt").to(device)
        gen = target.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)[0].tolist()
        n = enc["input_ids"].shape[1]
        new = gen[n:]
        if tok.eos_token_id in new:
            new = new[:new.index(tok.eos_token_id) + 1]
        seqs.append(gen[:n] + new)
        starts.append(n - 1)
    return seqs, starts


def measure(target_dir: str = minivllm.TINY_MODEL_DIR,
            draft_dir: str = minivllm.TINY_DRAFT_MODEL_DIR, stories: int = 50,
            prompt_words: int = 4) -> dict[str, Agreement]:
    """Agreement of the draft with the target on ``stories`` held-out stories, teacher-forced
    (``"held-out"``) and along the target's greedy continuations of their first
    ``prompt_words`` words (``"target-greedy"``, generated tokens only)."""
    t_tok, target = load(target_dir)
    d_tok, draft = load(draft_dir)
    probe = "Once upon a time, the little fox said: \"Q: 2 + 3?\"\n"
    if t_tok(probe)["input_ids"] != d_tok(probe)["input_ids"]:
        raise ValueError(f"{draft_dir} and {target_dir} tokenize text differently")
    docs = heldout_stories(stories)
    held = [story_tokens(t_tok, s) for s in docs]
    greedy, starts = target_greedy(t_tok, target, docs, prompt_words)
    return {"held-out": greedy_agreement(target, draft, held),
            "target-greedy": greedy_agreement(target, draft, greedy, starts)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stories", type=int, default=50, help="held-out stories")
    ap.add_argument("--k", type=int, action="append",
                    help="draft tokens per step for the tokens-per-step columns (repeatable; "
                         "default 2, 4, 8)")
    ap.add_argument("--prompt-words", type=int, default=4,
                    help="words of each story the target continues greedily")
    ap.add_argument("--target", default=minivllm.TINY_MODEL_DIR)
    ap.add_argument("--draft", default=minivllm.TINY_DRAFT_MODEL_DIR)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    ks = args.k or [2, 4, 8]
    if min(ks) < 1:
        ap.error(f"--k must be at least 1, got {min(ks)}")
    torch.set_num_threads(args.threads)
    print(f"$ python benchmarks/draft_agreement.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    res = measure(args.target, args.draft, args.stories, args.prompt_words)
    head = " | ".join(f"tokens/step k={k}" for k in ks)
    print(f"\n| sequences | positions | greedy agreement | {head} | target loss | draft loss |")
    print("|---|---:|---:|" + "---:|" * len(ks) + "---:|---:|")
    for name, a in res.items():
        per_step = " | ".join(f"{a.tokens_per_step(k):.2f}" for k in ks)
        print(f"| {name} | {a.positions:,} | {a.rate:.1%} | {per_step} | {a.loss('target'):.3f} "
              f"| {a.loss('draft'):.3f} |")
    print("\ntokens/step k: tokens per target forward pass with k draft tokens per step and "
          "greedy verification (exact for target-greedy, an estimate for held-out). "
          "Losses: mean nats per token of the sequences themselves.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
