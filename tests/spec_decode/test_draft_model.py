"""The shipped draft model (``minivllm/tiny_draft_model``): it installs with the package, it
shares the tiny model's tokenizer byte for byte, both loaders read it, and the agreement
measure of ``benchmarks/draft_agreement.py`` counts what it says."""

from __future__ import annotations

import filecmp
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch
from support import hf_greedy

import minivllm

ROOT = Path(__file__).resolve().parents[2]
DRAFT = Path(minivllm.TINY_DRAFT_MODEL_DIR)
TARGET = Path(minivllm.TINY_MODEL_DIR)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
FILES = ("config.json", "generation_config.json", "model.safetensors", *TOKENIZER_FILES)



def _load_benchmark():
    spec = importlib.util.spec_from_file_location("draft_agreement",
                                                  ROOT / "benchmarks" / "draft_agreement.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


draft_agreement = _load_benchmark()


@pytest.fixture(scope="module")
def models():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    load = {"local_files_only": True, "dtype": torch.float32}
    tok = AutoTokenizer.from_pretrained(str(TARGET), local_files_only=True)
    return (tok, AutoModelForCausalLM.from_pretrained(str(TARGET), **load).eval(),
            AutoModelForCausalLM.from_pretrained(str(DRAFT), **load).eval())


def test_draft_files_ship_with_the_package():
    assert DRAFT.parent == TARGET.parent
    assert sorted(p.name for p in DRAFT.iterdir()) == sorted(FILES)
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["minivllm"]
    assert "tiny_draft_model/*" in package_data
    assert sum(p.stat().st_size for p in DRAFT.iterdir()) < 1.5e6


def test_draft_tokenizer_and_vocabulary_are_the_targets():
    for name in TOKENIZER_FILES:
        assert filecmp.cmp(DRAFT / name, TARGET / name, shallow=False), name
    draft, target = (json.loads((d / "config.json").read_text()) for d in (DRAFT, TARGET))
    keys = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "model_type")
    assert {k: draft[k] for k in keys} == {k: target[k] for k in keys}
    assert draft["tie_word_embeddings"] is True
    assert draft["hidden_size"] < target["hidden_size"]
    assert draft["num_hidden_layers"] <= target["num_hidden_layers"]


def test_minivllm_greedy_on_the_draft_matches_transformers(models):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(DRAFT), local_files_only=True,
                                              dtype=torch.float32).eval()
    llm = minivllm.LLM(minivllm.TINY_DRAFT_MODEL_DIR, max_model_len=256)
    params = minivllm.SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outs = llm.generate(["Once upon a time", "The little fox"], params, use_tqdm=False)
    for o in outs:
        assert o.outputs[0].token_ids == hf_greedy(hf, o.prompt_token_ids, 40, eos=None)
        assert len(o.outputs[0].text.split()) >= 10, o.outputs[0].text


def test_tokens_per_step_simulates_greedy_verification():
    a = draft_agreement.Agreement([[True, True, False, True, False]], {"target": 0.0, "draft": 0.0})
    assert a.rate == pytest.approx(3 / 5)
    # k=2: keep 2 at 0, target fixes 2; keep 1 at 3, target fixes 4: two steps for 5 tokens
    assert a.tokens_per_step(2) == pytest.approx(5 / 2)
    # k=1: keep 1 at 0 (+1); fix at 2; keep 1 at 3 (+1): three steps
    assert a.tokens_per_step(1) == pytest.approx(5 / 3)
    full = draft_agreement.Agreement([[True] * 10], {"target": 0.0, "draft": 0.0})
    assert full.tokens_per_step(4) == pytest.approx(10 / 2)  # 4 kept + 1, then 4 kept + 1
    with pytest.raises(ValueError, match="k must be at least 1, got 0"):
        a.tokens_per_step(0)


def test_agreement_with_itself_is_total_and_the_draft_is_partial(models):
    tok, target, draft = models
    stories = draft_agreement.heldout_stories(3)
    seqs = [draft_agreement.story_tokens(tok, s) for s in stories]
    assert all(s[0] == tok.bos_token_id and s[-1] == tok.eos_token_id for s in seqs)
    same = draft_agreement.greedy_agreement(target, target, seqs)
    assert same.positions == sum(len(s) - 1 for s in seqs)
    assert same.rate == 1.0 and same.loss("target") == pytest.approx(same.loss("draft"))
    got = draft_agreement.greedy_agreement(target, draft, seqs)
    assert 0.5 < got.rate < 1.0
    assert got.positions == same.positions and got.loss("target") == same.loss("target")
    greedy, starts = draft_agreement.target_greedy(tok, target, stories[:1], prompt_words=3)
    assert greedy[0][-1] == tok.eos_token_id and starts[0] == len(tok(" ".join(
        stories[0].split(" ")[:3]))["input_ids"]) - 1
    with pytest.raises(ValueError, match="start 99 must be in"):
        draft_agreement.greedy_agreement(target, draft, seqs[:1], [99])


def test_training_script_reuses_a_tokenizer(tmp_path):
    out = tmp_path / "draft"
    cmd = [sys.executable, str(ROOT / "scripts" / "train_tiny_model.py"), "--out", str(out),
           "--tokenizer-from", str(TARGET), "--docs", "200", "--heldout-docs", "20",
           "--steps", "2", "--warmup", "1", "--batch-size", "2", "--seq-len", "32",
           "--hidden", "32", "--intermediate", "64", "--layers", "1", "--heads", "2",
           "--kv-heads", "1", "--threads", "1", "--max-new-tokens", "2", "--prompt", "Tom"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    for name in TOKENIZER_FILES:
        assert filecmp.cmp(out / name, TARGET / name, shallow=False), name
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 1976
    bad = subprocess.run(cmd + ["--vocab", "512"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--vocab 512 cannot be combined" in bad.stderr
