"""The work counts the speed benchmarks print beside their timings (load-independent evidence): how
lm-evaluation-harness batches CrowS-Pairs, the matmul FLOP model and the trie floor of exact scoring
(benchmarks/bench_crows_pairs.py). Hand-computed cases; the scripts themselves run only on a quiet machine."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_lm_eval_batches_sort_longest_first_and_pad_each_batch_to_its_longest():
    crows = _bench("bench_crows_pairs")
    # lengths 3, 5, 2, 7, 1 sorted 7, 5, 3, 2, 1 -> batches [7, 5], [3, 2], [1]: 2 rows of 7, 2 of 3, 1 of 1
    inputs = [[0] * 3, [0] * 5, [0] * 2, [0] * 7, [0] * 1]
    assert crows.lm_eval_batches(inputs, 2) == [(2, 7), (2, 3), (1, 1)]
    assert crows.lm_eval_batches([[1, 2], [3, 4, 5], [6]], 64) == [(3, 3)]


def test_lm_eval_batches_run_an_input_shared_by_several_requests_once():
    """lm-evaluation-harness's Collator (group_by="contexts") runs requests with the same model input once: two
    sentences that differ only in their last token cost one row."""
    crows = _bench("bench_crows_pairs")
    assert crows.lm_eval_batches([[9, 1, 2], [9, 1, 2], [9, 3]], 64) == [(2, 3)]
    assert crows.lm_eval_batches([[9, 1, 2], [9, 1, 2], [9, 3]], 1) == [(1, 3), (1, 2)]


def test_matmul_flops_counts_body_attention_and_head():
    crows = _bench("bench_crows_pairs")
    # 2 rows of 3 slots, d=2, one layer: 6 slots × (24·4 + 4·3·2) = 720; 4 head rows × 2·2·5 = 80
    assert crows.matmul_flops([(2, 3)], 4, d=2, vocab=5, n_layers=1) == 800.0
    assert crows.matmul_flops([(1, 3), (1, 3)], 4, d=2, vocab=5, n_layers=2) == 2 * 720 + 80


def test_trie_floor_counts_distinct_prefixes_that_predict():
    crows = _bench("bench_crows_pairs")
    # proper prefixes: (0) and (0, 1) — the full sequences' last tokens predict nothing
    assert crows.trie_floor([[0, 1, 2], [0, 1, 3], [0, 4]]) == 2
    assert crows.trie_floor([[9, 8], [9, 8]]) == 1  # a repeated sentence costs nothing more
    assert crows.trie_floor([[5], [5, 6]]) == 1  # a sentence that starts a longer one: its state predicts 6
