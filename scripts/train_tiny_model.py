"""Train the course's tiny offline model (``minivllm/tiny_model``) from scratch.

Steps, all seeded:

1. generate a synthetic English corpus with ``scripts/tiny_corpus.py``
   (training documents from ``--seed``, held-out documents from another seed);
2. train a byte-level BPE tokenizer on it (``<pad>``=0, ``<s>``=1, ``</s>``=2;
   the post-processor puts ``<s>`` in front of every encoded text) and save it
   as a ``PreTrainedTokenizerFast``;
3. train a small ``LlamaForCausalLM`` (GQA, tied embeddings) on documents
   written as ``<s> text </s>`` and packed into 256-token rows, with AdamW,
   linear warmup and cosine decay;
4. save config.json, generation_config.json, model.safetensors (fp32) next to
   the tokenizer files, then print a few greedy samples.

Default command (about 15 minutes on a 2-core CPU)::

    python scripts/train_tiny_model.py --out minivllm/tiny_model

Only print greedy samples from an already trained checkpoint::

    python scripts/train_tiny_model.py --sample-only --out minivllm/tiny_model

A smaller model that shares the tiny model's tokenizer (a draft for speculative
decoding): ``--tokenizer-from DIR`` skips step 2 and copies DIR's tokenizer
files unchanged, so token ids mean the same in both models. The corpus and the
held-out rows are the same as for the tiny model, so the losses compare
directly (the exact command is in docs/tiny_model.md, "The draft model")::

    python scripts/train_tiny_model.py --tokenizer-from minivllm/tiny_model \
        --out minivllm/tiny_draft_model --hidden 64 --layers 2 --heads 2 --kv-heads 1 ...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_corpus  # noqa: E402

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
KEEP_FILES = {"config.json", "generation_config.json", "model.safetensors", *TOKENIZER_FILES}
DEFAULT_VOCAB = 2048
DEFAULT_PROMPTS = ["Once upon a time", "The little fox", "Tom went to the",
                   "Lily wanted to learn to", "Q: What color is the sky?"]


def log(msg: str) -> None:
    print(msg, flush=True)


# A plain chat format the model can continue: system text, then 'User:' / 'Assistant:' turns.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ message['content'] | trim }}\n\n{% elif message['role'] == 'user' %}User: {{ me"
    "ssage['content'] | trim }}\n{% elif message['role'] == 'assistant' %}Assistant: {"
    "{ message['content'] | trim }}\n{% else %}{{ raise_exception('message role must b"
    "e system, user or assistant, got ' + message['role']) }}{% endif %}{% endfor %}{"
    "% if add_generation_prompt %}Assistant:{% endif %}"
)

# --------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------


def train_tokenizer(docs: list[str], vocab_size: int, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # add_prefix_space=False: the first word of a text has no leading space,
    # exactly like the first word of every training document.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    # Name the generic fast-tokenizer class (transformers 5 writes its new
    # "TokenizersBackend" alias, which 4.x does not know) and write
    # special_tokens_map.json, which 5 no longer writes but 4.x and our own
    # loader read.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("backend", None)
    # Without this, transformers 4.x also returns token_type_ids, which
    # LlamaForCausalLM.generate() rejects.
    cfg["model_input_names"] = ["input_ids", "attention_mask"]
    cfg["chat_template"] = CHAT_TEMPLATE  # for `minivllm serve`'s /v1/chat/completions
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    with open(out / "special_tokens_map.json", "w", encoding="utf-8") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, f, indent=2)
        f.write("\n")
    return fast


def reuse_tokenizer(src: Path, out: Path):
    """Copy ``src``'s tokenizer files into ``out`` byte for byte and load them.

    The special tokens must sit where ``train_tokenizer`` puts them, since the
    model config and the row packing rely on ``<pad>``/``<s>``/``</s>`` = 0/1/2.
    """
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, out / name)
    tok = PreTrainedTokenizerFast.from_pretrained(str(out), local_files_only=True)
    wanted = {PAD: 0, BOS: 1, EOS: 2}
    got = {t: tok.convert_tokens_to_ids(t) for t in wanted}
    if got != wanted or (tok.pad_token, tok.bos_token, tok.eos_token) != (PAD, BOS, EOS):
        raise ValueError(f"--tokenizer-from {str(src)!r}: special tokens must be {wanted} "
                         f"(pad, bos, eos), got {got}")
    return tok


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------


def corpus_split(n_docs: int, n_heldout: int, seed: int) -> tuple[list[str], list[str]]:
    """Training documents from ``seed``; held-out ones from ``seed + 10000``, minus any
    document that also appears word for word in the training set (truly unseen text)."""
    train_docs = tiny_corpus.generate_corpus(n_docs, seed=seed)
    held_docs = tiny_corpus.generate_corpus(n_heldout, seed=seed + 10_000)
    train_set = set(train_docs)
    return train_docs, [d for d in held_docs if d not in train_set]


def encode_docs(tok, docs: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """One long token stream of ``<s> doc </s>`` and the offset where each doc starts."""
    eos = tok.eos_token_id
    ids = tok(docs, add_special_tokens=True)["input_ids"]  # each starts with <s>
    starts, stream = [], []
    for x in ids:
        starts.append(len(stream))
        stream.extend(x)
        stream.append(eos)
    return torch.tensor(stream, dtype=torch.long), torch.tensor(starts, dtype=torch.long)


class RowSampler:
    """Rows of ``seq_len`` tokens that each begin at the start of a document.

    Every row therefore starts with ``<s>`` at position 0, just like a prompt
    at inference time; the rest of the row packs the following documents.
    Document starts are visited in a seeded random order, without repeats
    until all have been used.
    """

    def __init__(self, stream: torch.Tensor, starts: torch.Tensor, seq_len: int, seed: int):
        self.stream, self.seq_len = stream, seq_len
        self.starts = starts[starts + seq_len <= len(stream)]
        self.gen = torch.Generator().manual_seed(seed)
        self.order, self.pos = torch.randperm(len(self.starts), generator=self.gen), 0

    def batch(self, batch_size: int) -> torch.Tensor:
        rows = []
        for _ in range(batch_size):
            if self.pos == len(self.order):
                self.order, self.pos = torch.randperm(len(self.starts), generator=self.gen), 0
            s = int(self.starts[self.order[self.pos]])
            self.pos += 1
            rows.append(self.stream[s:s + self.seq_len])
        return torch.stack(rows)


@torch.no_grad()
def eval_loss(model, rows: torch.Tensor, batch_size: int) -> float:
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(rows), batch_size):
        x = rows[i:i + batch_size]
        total += model(input_ids=x, labels=x).loss.item() * len(x)
        n += len(x)
    model.train()
    return total / n


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


def build_config(args, tok):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        hidden_act="silu",
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        initializer_range=0.02,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        use_cache=True,
    )


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    floor = args.lr * args.min_lr_frac
    return floor + (args.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))


def save_checkpoint(model, tok, out: Path) -> None:
    from transformers import GenerationConfig

    model.config.dtype = torch.float32
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        do_sample=False,
    ).save_pretrained(str(out))
    # Also spell out the older flat keys so that simple loaders (ours) and
    # transformers 4.x read the same values as transformers 5 does.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    cfg["torch_dtype"] = "float32"
    cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for p in out.iterdir():
        if p.name not in KEEP_FILES:
            p.unlink()


# --------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------


def sample(out: Path, prompts: list[str], max_new_tokens: int) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    model.eval()
    for prompt in prompts:
        enc = tok(prompt, return_tensors="pt")
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
        new = gen[0, enc["input_ids"].shape[1]:].tolist()
        ended = tok.eos_token_id in new
        if ended:
            new = new[:new.index(tok.eos_token_id) + 1]
        text = tok.decode(new, skip_special_tokens=True)
        how = f"ended with </s> after {len(new)} tokens" if ended else f"no </s> in {len(new)} tokens"
        log(f"\n>>> {prompt!r}  ({how})\n{prompt}{text}")


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="minivllm/tiny_model", help="checkpoint directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--steps", type=int, default=700, help="optimizer steps")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--docs", type=int, default=70000, help="training documents")
    ap.add_argument("--heldout-docs", type=int, default=1500)
    ap.add_argument("--vocab", type=int, default=None,
                    help=f"tokenizer vocabulary to train (default {DEFAULT_VOCAB}); "
                         "not allowed with --tokenizer-from")
    ap.add_argument("--tokenizer-from", type=Path, default=None, metavar="DIR",
                    help="reuse DIR's tokenizer files (copied unchanged) instead of training "
                         "a tokenizer; the vocabulary is DIR's")
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--sample-only", action="store_true", help="only print greedy samples from --out")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--prompt", action="append", help="sample prompt (repeatable)")
    args = ap.parse_args()
    if args.tokenizer_from is not None and args.vocab is not None:
        ap.error(f"--vocab {args.vocab} cannot be combined with --tokenizer-from: "
                 "the vocabulary is the reused tokenizer's")
    src = args.tokenizer_from
    if src is not None and not args.sample_only:
        if not src.is_dir():
            ap.error(f"--tokenizer-from {str(src)!r} is not a directory")
        missing = [name for name in TOKENIZER_FILES if not (src / name).is_file()]
        if missing:
            ap.error(f"--tokenizer-from {str(src)!r} lacks {', '.join(missing)}")
        if src.resolve() == Path(args.out).resolve():
            ap.error(f"--tokenizer-from {str(src)!r} is the --out directory, "
                     "whose files training replaces")
    if args.vocab is None:
        args.vocab = DEFAULT_VOCAB
    if args.hidden % args.heads:
        ap.error(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    if args.heads % args.kv_heads:
        ap.error(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    if (args.hidden // args.heads) % 2:
        ap.error(f"head_dim = --hidden / --heads = {args.hidden // args.heads} is odd; "
                 "the rotary embedding rotates pairs of channels")
    return args


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    prompts = args.prompt or DEFAULT_PROMPTS
    if args.sample_only:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        sample(out, prompts, args.max_new_tokens)
        return

    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    t0 = time.time()
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    # 1. corpus ----------------------------------------------------------
    train_docs, held_docs = corpus_split(args.docs, args.heldout_docs, args.seed)
    log(f"corpus: {len(train_docs)} train docs ({sum(map(len, train_docs)) / 1e6:.1f} MB), "
        f"{len(held_docs)} held-out docs")

    # 2. tokenizer --------------------------------------------------------
    if out.exists():
        for p in out.iterdir():
            if p.name in KEEP_FILES:
                p.unlink()
    if args.tokenizer_from is not None:
        tok = reuse_tokenizer(args.tokenizer_from, out)
        log(f"tokenizer: copied from {args.tokenizer_from}")
    else:
        tok = train_tokenizer(train_docs, args.vocab, out)
    stream, starts = encode_docs(tok, train_docs)
    h_stream, h_starts = encode_docs(tok, held_docs)
    log(f"tokenizer: vocab {len(tok)}; train stream {len(stream):,} tokens "
        f"({len(stream) / len(train_docs):.1f}/doc), held-out {len(h_stream):,} tokens")
    sampler = RowSampler(stream, starts, args.seq_len, args.seed)
    h_sampler = RowSampler(h_stream, h_starts, args.seq_len, args.seed + 1)
    held_rows = h_sampler.batch(min(128, len(h_sampler.starts)))

    # 3. model + optimizer -----------------------------------------------
    config = build_config(args, tok)
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters (fp32 {n_params * 4 / 2**20:.2f} MiB); "
        f"hidden {args.hidden}, {args.layers} layers, {args.heads} heads / {args.kv_heads} kv heads")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )

    # 4. train -------------------------------------------------------------
    model.train()
    recent: list[float] = []
    t_train = time.time()
    for step in range(args.steps):
        lr = lr_at(step, args)
        for g in opt.param_groups:
            g["lr"] = lr
        x = sampler.batch(args.batch_size)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        recent.append(loss.item())
        recent = recent[-50:]
        if (step + 1) % args.log_every == 0 or step == 0:
            el = time.time() - t_train
            tps = (step + 1) * args.batch_size * args.seq_len / el
            log(f"step {step + 1:5d}/{args.steps}  loss {recent[-1]:.4f}  "
                f"avg50 {sum(recent) / len(recent):.4f}  lr {lr:.2e}  "
                f"{tps:,.0f} tok/s  {el / 60:.1f} min")
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            log(f"  held-out loss {eval_loss(model, held_rows, args.batch_size):.4f}")

    train_loss = sum(recent) / len(recent)
    held_loss = eval_loss(model, held_rows, args.batch_size)
    save_checkpoint(model, tok, out)
    size = sum(p.stat().st_size for p in out.iterdir())
    wall = time.time() - t0
    log(f"\nfinal train loss (mean of last {len(recent)} steps): {train_loss:.4f}")
    log(f"final held-out loss: {held_loss:.4f}")
    log(f"tokens seen: {args.steps * args.batch_size * args.seq_len:,}")
    log(f"saved {out} ({size / 2**20:.2f} MiB); total wall time {wall / 60:.1f} min")
    sample(out, prompts, args.max_new_tokens)


if __name__ == "__main__":
    main()
