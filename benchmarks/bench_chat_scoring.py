"""LMB scoring in the chat format against the raw format and against PyTorch, in one interleaved run.

The model is a Llama-architecture model of DialoGPT-small's size (as ``bench_scoring.py --family llama``: 12 layers,
width 768, 12 query heads sharing 4 key/value heads, gated MLP of 2,048, tied head) with seeded random weights,
built by ``transformers``, saved and loaded through rbjax's loader. Its tokenizer is GPT-2's BPE (so a phrase has
its DialoGPT length) with Llama 3's five chat tokens added (``<|begin_of_text|>``, ``<|end_of_text|>``,
``<|start_header_id|>``, ``<|end_header_id|>``, ``<|eot_id|>``) and Meta-Llama-3-8B-Instruct's chat template. Each
phrase is the assistant's reply after a system prompt and a user message (``--system``, ``--prompt``): the template
adds a shared prefix of about 25 tokens to every phrase.

Methods, on the same RedditBias test pairs (evenly spaced over the five bias types, both sides), in interleaved
rounds (medians reported):

* ``rbjax_raw``: ``PerplexityScorer.score_pairs`` on the bare phrases (the paper's format);
* ``rbjax_chat``: the same scorer on the rendered chats, only the phrase's tokens scored (``n_context``): each
  pair's common prefix run once, and the template prefix that every phrase shares run once per packed row;
* ``torch_sorted_chat``: PyTorch on the same rendered chats (the same token ids, up to the end of each phrase),
  length-sorted padded batches of ``--torch-batch``, logits on every position, the phrase's NLL gathered;
* ``torch_sorted_raw``: PyTorch on the bare phrases, for its own chat/raw ratio.

Targets: rbjax_chat ≥ 0.8 × rbjax_raw and ≥ 1.4 × torch_sorted_chat (phrases per second). Also printed: the
perplexities of rbjax_chat against PyTorch's (max relative difference), the work accounting of the scorer
(``last_stats``: slots run, the row context, rows), machine and date. The last line is JSON. The foreign CPU of the
timed sections is recorded (``"load"``); the ratios are VOID (under ``"void_ratios"``) when it exceeds the threshold
of ``benchmarks/_common.py``.

    python benchmarks/bench_chat_scoring.py [--n-pairs 160] [--rounds 3] [--batch-size 64]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import LoadMonitor  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))
TYPES = ("religion1", "religion2", "race", "gender", "queerness")
LLAMA3_TEMPLATE = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
                   "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
                   "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
                   "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
                   "<|end_header_id|>\n\n' }}{% endif %}")
CHAT_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def chat_tokenizer_folder(gpt2_dir: Path, folder: Path) -> Path:
    """GPT-2's BPE as a tokenizer.json with Llama 3's chat tokens added and its chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.BPE.from_file(str(gpt2_dir / "vocab.json"), str(gpt2_dir / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(["<|endoftext|>", *CHAT_TOKENS])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
         "eos_token": "<|end_of_text|>", "chat_template": LLAMA3_TEMPLATE}))
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-pairs", type=int, default=160, help="evenly spaced sample of the 1,216 test pairs")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    ap.add_argument("--batch-size", type=int, default=64, help="rbjax nominal phrases per batch (1,024 slots)")
    ap.add_argument("--torch-batch", type=int, default=64, help="PyTorch phrases per padded batch")
    ap.add_argument("--system", default="You are a helpful assistant.", help="system prompt of every chat")
    ap.add_argument("--prompt", default="What do you think?", help="the user message every phrase replies to")
    ap.add_argument("--data-dir", default=str(SHARED / "redditbias"))
    ap.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2"))
    args = ap.parse_args()

    import jax
    import torch
    import transformers

    from rbjax.data.redditbias import load_pairs
    from rbjax.lmb.perplexity import PerplexityScorer
    from rbjax.model.chat import ChatTurns
    from rbjax.model.hf import load_pretrained
    from rbjax.model.tokenizer import load_tokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    mon = LoadMonitor()
    tmp = Path(tempfile.mkdtemp(prefix="rbjax-bench-chat-"))
    try:
        folder = chat_tokenizer_folder(Path(args.tokenizer), tmp / "model")
        tok = load_tokenizer(folder, expected_vocab_size=None)
        cfg_json = json.loads((SHARED / "models/dialogpt-small-config/config.json").read_text())
        torch.manual_seed(0)
        tcfg = transformers.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=cfg_json["n_embd"],
                                        intermediate_size=2048, num_hidden_layers=cfg_json["n_layer"],
                                        num_attention_heads=cfg_json["n_head"], num_key_value_heads=4,
                                        max_position_embeddings=cfg_json["n_positions"], tie_word_embeddings=True,
                                        bos_token_id=tok.token_to_id("<|begin_of_text|>"),
                                        eos_token_id=tok.token_to_id("<|end_of_text|>"))
        tmodel = transformers.LlamaForCausalLM(tcfg).eval()
        tmodel.save_pretrained(folder)
        cfg, params = load_pretrained(folder)

        biased, counter = [], []
        for b in TYPES:
            p = load_pairs(b, "test", Path(args.data_dir))
            biased += p.biased
            counter += p.counterfactual
        if args.n_pairs < len(biased):
            idx = np.linspace(0, len(biased) - 1, args.n_pairs).astype(int)
            biased, counter = [biased[i] for i in idx], [counter[i] for i in idx]
        raw_a, raw_c = tok.encode_batch(biased), tok.encode_batch(counter)
        chat = ChatTurns(tok, tok.chat_template, system=args.system, prompt=args.prompt)
        sa, sc = chat.encode(biased), chat.encode(counter)
        chat_a, chat_c = [list(s.ids) for s in sa], [list(s.ids) for s in sc]
        ctx = ([s.n_context for s in sa], [s.n_context for s in sc])
        n = 2 * len(biased)
        raw_ids, chat_ids = raw_a + raw_c, chat_a + chat_c
        starts = ctx[0] + ctx[1]
        print(f"{len(biased)} pairs, {n} phrases; raw {sum(map(len, raw_ids))} tokens, chat "
              f"{sum(map(len, chat_ids))} tokens (template prefix {min(starts)}-{max(starts)} tokens)", file=sys.stderr)

        scorer = PerplexityScorer(params, cfg, batch_size=args.batch_size)
        first = {}
        with mon.section("first_calls"):
            t0 = time.perf_counter()
            scorer.score_pairs(raw_a, raw_c)
            first["raw"] = time.perf_counter() - t0
            stats_raw = dict(scorer.last_stats)
            t0 = time.perf_counter()
            scorer.score_pairs(chat_a, chat_c, n_context=ctx)
            first["chat"] = time.perf_counter() - t0
        stats_chat = dict(scorer.last_stats)

        def rb_raw():
            a, c = scorer.score_pairs(raw_a, raw_c)
            return np.concatenate([a.mean_nll, c.mean_nll])

        def rb_chat():
            a, c = scorer.score_pairs(chat_a, chat_c, n_context=ctx)
            return np.concatenate([a.mean_nll, c.mean_nll])

        def torch_sorted(ids, first_scored):
            """Mean NLL of tokens ids[first_scored:] per phrase (first_scored 1: all but the first token)."""
            out = np.zeros(len(ids))
            order = list(np.argsort([len(s) for s in ids], kind="stable"))
            with torch.inference_mode():
                for k in range(0, len(ids), args.torch_batch):
                    rows = order[k:k + args.torch_batch]
                    L = max(len(ids[i]) for i in rows)
                    x = torch.zeros((len(rows), L), dtype=torch.long)
                    m = torch.zeros((len(rows), L), dtype=torch.long)
                    w = torch.zeros((len(rows), L - 1))
                    for r, i in enumerate(rows):
                        x[r, :len(ids[i])] = torch.tensor(ids[i])
                        m[r, :len(ids[i])] = 1
                        w[r, max(first_scored[i], 1) - 1:len(ids[i]) - 1] = 1  # position j-1 predicts token j
                    logits = tmodel(x, attention_mask=m).logits[:, :-1].float()
                    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
                    out[rows] = ((nll * w).sum(1) / w.sum(1)).numpy()
            return out

        runs = {"rbjax_raw": rb_raw, "rbjax_chat": rb_chat,
                "torch_sorted_chat": lambda: torch_sorted(chat_ids, starts),
                "torch_sorted_raw": lambda: torch_sorted(raw_ids, [1] * n)}
        rates: dict = {k: [] for k in runs}
        outputs = {}
        start_time = datetime.datetime.now(datetime.timezone.utc)
        with mon.section("rounds"):  # every method's rounds, interleaved
            for _ in range(args.rounds):
                for k, fn in runs.items():
                    t0 = time.perf_counter()
                    outputs[k] = fn()
                    rates[k].append(n / (time.perf_counter() - t0))
        end_time = datetime.datetime.now(datetime.timezone.utc)
        res = {k: float(np.median(v)) for k, v in rates.items()}
        res["rounds"] = {k: [round(x, 2) for x in v] for k, v in rates.items()}
        # per round (the methods of a round ran back to back: a change of the machine's load between rounds cancels)
        res["void_ratios_per_round" if mon.void_sections(["rounds"]) else "ratios_per_round"] = per_round = {
            "rbjax_chat_over_rbjax_raw": [round(c / r, 3) for c, r in zip(rates["rbjax_chat"], rates["rbjax_raw"])],
            "rbjax_chat_over_torch_sorted_chat": [round(c / t, 3) for c, t in zip(rates["rbjax_chat"],
                                                                                 rates["torch_sorted_chat"])]}
        ratios = {"rbjax_chat_over_rbjax_raw": res["rbjax_chat"] / res["rbjax_raw"],
                         "rbjax_chat_over_torch_sorted_chat": res["rbjax_chat"] / res["torch_sorted_chat"],
                         "torch_chat_over_torch_raw": res["torch_sorted_chat"] / res["torch_sorted_raw"]}
        ours, ref = np.exp(outputs["rbjax_chat"]), np.exp(outputs["torch_sorted_chat"])
        res["max_rel_diff_ppl_chat_rbjax_vs_torch"] = float(np.max(np.abs(ours - ref) / ref))
        ours, ref = np.exp(outputs["rbjax_raw"]), np.exp(outputs["torch_sorted_raw"])
        res["max_rel_diff_ppl_raw_rbjax_vs_torch"] = float(np.max(np.abs(ours - ref) / ref))
        res["plan_raw"], res["plan_chat"] = stats_raw, stats_chat
        res["tokens"] = {"raw": sum(map(len, raw_ids)), "chat": sum(map(len, chat_ids)),
                         "template_prefix": [min(starts), max(starts)]}
        res["first_call_s"] = {k: round(v, 2) for k, v in first.items()}
        res["compiled_programs"] = scorer.compile_count
        res.update(n_pairs=len(biased), n_phrases=n, batch_size=args.batch_size, torch_batch=args.torch_batch,
                   rounds_n=args.rounds, system=args.system, prompt=args.prompt,
                   machine=f"{cpu_name()}, {os.cpu_count()} CPU cores, jax {jax.__version__} "
                           f"({jax.default_backend()}), torch {torch.__version__}",
                   utc=f"{start_time:%Y-%m-%d %H:%M}–{end_time:%H:%M}")
        try:
            res["load_average"] = os.getloadavg()
        except OSError:
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nmachine: {res['machine']}; {res['utc']} UTC", file=sys.stderr)
    for k in runs:
        print(f"{k:<20} {res[k]:8.1f} phrases/s   rounds {res['rounds'][k]}", file=sys.stderr)
    r = {k: mon.ratio_text(v, sections=["rounds"]) for k, v in ratios.items()}
    pr = per_round
    print(f"rbjax chat / rbjax raw: {r['rbjax_chat_over_rbjax_raw']} (target ≥ 0.8; per round "
          f"{pr['rbjax_chat_over_rbjax_raw']})\n"
          f"rbjax chat / PyTorch sorted chat: {r['rbjax_chat_over_torch_sorted_chat']} (target ≥ 1.4; per round "
          f"{pr['rbjax_chat_over_torch_sorted_chat']})\n"
          f"PyTorch chat / PyTorch raw: {r['torch_chat_over_torch_raw']}\n"
          f"parity chat: max rel diff ppl {res['max_rel_diff_ppl_chat_rbjax_vs_torch']:.1e}; raw "
          f"{res['max_rel_diff_ppl_raw_rbjax_vs_torch']:.1e}\n"
          f"plan raw: {stats_raw}\nplan chat: {stats_chat}", file=sys.stderr)
    mon.finish(res, ratios, depends={k: ["rounds"] for k in ratios})
    print(json.dumps(res))


if __name__ == "__main__":
    main()
